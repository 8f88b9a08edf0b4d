"""The wheelhouse: wheels with their provenance, and a PEP 503 index pip can install from.

Layout under the wheelhouse root::

    <project>/<wheel>                     the wheel
    <project>/<wheel>.manifest.json       where it came from (the commit record)
    simple/index.html                     PEP 503 root: one link per distribution
    simple/<normalized-name>/index.html   links ../../<project>/<wheel>#sha256=<hex>

Publishing is atomic. Under one lock (``.kforge.lock``, see :mod:`kforge.locking`), the wheel and its
manifest are copied to temporary files beside their final names, then renamed into place (manifest
first, wheel last: a manifest whose wheel never arrived is swept under the next lock), then the index is
regenerated. The wheelhouse verifies, never trusts: every index
rewrite recomputes each wheel's sha256 and lists a wheel only when its manifest agrees (file name, size
and sha256); a disagreeing or unreadable manifest is reported by name (:class:`Problem`) and its wheel
left out. Index pages are each written atomically, distribution pages before the root page and stale
pages removed last, so at every instant each page is the old or the new one and every link resolves to
a complete wheel whose bytes match the link's hash. Two different wheels with one file name are refused
(``replace=True`` replaces on purpose). Published files are 0644 and folders 0755 whatever the umask, so
a web server running as another user can serve them (``python -m http.server`` in the root).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from kforge import locking
from kforge.errors import PublishError, os_fix
from kforge.fsutil import PUBLIC_DIR_MODE, PUBLIC_FILE_MODE, atomic_write_text, sha256_file

LOCK_NAME = ".kforge.lock"
MANIFEST_SUFFIX = ".manifest.json"
REPORT_SUFFIX = ".report"
INDEX_DIR = "simple"
#: Test hook: seconds to sleep after the temp files are written and before they are renamed.
PAUSE_ENV = "KFORGE_TEST_PUBLISH_PAUSE"
#: Test hook for the fault suite: ``<point>[@<n>][:SIGINT]``; the process signals itself at the n-th pass
#: through that point (SIGKILL by default). Points: see :data:`FAULT_POINTS`.
FAULT_ENV = "KFORGE_TEST_FAULT"
FAULT_POINTS = ("locked", "wheel-temp", "manifest-temp", "manifest-renamed", "wheel-renamed",
                "index-page", "index-root", "index-pruned")
TMP_MARK = ".kforge-tmp-"
_BLOCK = 1 << 20


@dataclass(frozen=True)
class Manifest:
    """Provenance of one wheel. ``sha256``, ``size``, ``wheel`` and ``attachments`` are filled in by :func:`publish`.

    ``toolchain`` holds at least ``nvcc``, ``torch`` and ``python``; ``host`` the machine
    (name, platform, cpus, memory); ``doctor`` the doctor's JSON result; ``source_pin`` the
    commit (git, kernels/) or ``<name>==<version> sha256:<hex>`` (sdist).
    """

    target: str
    project: str = ""
    archs: tuple[str, ...] = ()
    source_kind: str = ""  # "git" | "sdist" | "local"
    source_pin: str | None = None
    source_dirty: bool = False
    patch_series_hash: str | None = None
    patches: tuple[str, ...] = ()
    toolchain: Mapping[str, Any] = field(default_factory=dict)
    host: Mapping[str, Any] = field(default_factory=dict)
    built_at: str | None = None  # ISO 8601 UTC
    build_seconds: float | None = None
    peak_rss: int | None = None  # bytes, the build's peak memory
    repaired_tag: str | None = None
    doctor: Mapping[str, Any] | None = None
    report_path: str | None = None  # relative to the manifest's folder
    attachments: tuple[str, ...] = ()  # relative to the manifest's folder
    sha256: str = ""
    size: int = 0
    wheel: str = ""
    schema: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest; raises ValueError (with the reason) for anything that is not one."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a manifest is a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if not isinstance(data.get("target"), str):
            raise ValueError("it has no 'target'")
        for key in ("archs", "patches", "attachments"):
            if key in data and data[key] is not None:
                if not isinstance(data[key], list):
                    raise ValueError(f"'{key}' is not a list")
                data[key] = tuple(data[key])
        for key, typ in (("sha256", str), ("wheel", str), ("size", int)):
            if key in data and (not isinstance(data[key], typ) or isinstance(data[key], bool)):
                raise ValueError(f"'{key}' is not {typ.__name__}")
        return cls(**data)


@dataclass(frozen=True)
class PublishedWheel:
    project: str
    wheel: Path
    manifest: Path
    record: Manifest
    index: Path

    @property
    def filename(self) -> str:
        return self.wheel.name

    @property
    def sha256(self) -> str:
        return self.record.sha256


@dataclass(frozen=True)
class Problem:
    """One thing in a wheelhouse that is not as its manifests and index say."""

    path: Path
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what} ({self.fix})"


@dataclass(frozen=True)
class Scan:
    """The wheels that check out, and the problems found on the way."""

    wheels: tuple[PublishedWheel, ...]
    problems: tuple[Problem, ...]


# --------------------------------------------------------------------------- small helpers


def fault_point(name: str) -> None:
    """Test hook (``KFORGE_TEST_FAULT=<point>[@<n>][:SIGINT]``): signal this process at the n-th pass there."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    where, _, sig = spec.partition(":")
    point, _, nth = where.partition("@")
    if point != name:
        return
    _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
    if _FAULT_HITS[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGINT if sig == "SIGINT" else signal.SIGKILL)
        time.sleep(1)  # SIGINT arrives between bytecodes: let it


_FAULT_HITS: dict[str, int] = {}


def lock_wheelhouse(root: Path, target: str, timeout: float | None, wait: bool = True):  # noqa: ANN202
    make_root(root)
    return locking.hold(root / LOCK_NAME, target=target, what=f"the wheelhouse {root}", error=PublishError,
                        wait=wait, timeout=timeout)


def make_root(root: Path) -> None:
    """Create the wheelhouse folder (0755) or explain why it can't be one."""
    if root.exists() and not root.is_dir():
        raise PublishError(f"the wheelhouse {root} is a file, not a directory",
                           fix="point --wheelhouse / KFORGE_WHEELHOUSE at a directory")
    public_dirs(root)


def public_dirs(path: Path) -> None:
    """mkdir -p ``path``; folders this creates get 0755 whatever the umask."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        os.chmod(d, PUBLIC_DIR_MODE)


def _check_project(project: str) -> None:
    if (not project or project in (".", "..", INDEX_DIR) or "/" in project or "\\" in project
            or project.startswith(".") or not project.isascii()):
        raise PublishError(f"'{project}' cannot be a wheelhouse folder name",
                           fix="use the kforge project name, e.g. fmha or flash-attn")


def _copy_hashing(src: Path, dst_fd: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, os.fdopen(dst_fd, "wb") as fout:
        while block := fin.read(_BLOCK):
            digest.update(block)
            fout.write(block)
            size += len(block)
        fout.flush()
        os.fsync(fout.fileno())
    return digest.hexdigest(), size


def os_error(exc: OSError, root: Path, doing: str) -> PublishError:
    """ENOSPC, EROFS, EACCES while writing the wheelhouse: a publish error that says what to do."""
    where = exc.filename or root
    return PublishError(f"cannot {doing} in the wheelhouse {root}: {exc.strerror} ({where})",
                        why="nothing was published: the wheelhouse is as it was",
                        fix=os_fix(exc.errno) + " (--wheelhouse / KFORGE_WHEELHOUSE)")


# --------------------------------------------------------------------------- publish


def publish(
    wheelhouse_root: Path,
    project: str,
    wheel: Path,
    manifest: Manifest,
    *,
    replace: bool = False,
    attachments: tuple[Path, ...] | list[Path] = (),
    lock_timeout: float | None = None,
    wait: bool = True,
) -> PublishedWheel:
    """Store ``wheel`` and its manifest under ``<root>/<project>/`` and refresh the index, atomically.

    A wheel of the same file name and other bytes is refused unless ``replace``. ``attachments`` (the
    build report, its timeline) are stored in ``<wheel>.report/`` and linked from the manifest
    (``report_path`` is the one named ``report.json``).
    """
    root = Path(wheelhouse_root)
    wheel = Path(wheel)
    _check_project(project)
    try:
        parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise PublishError(f"{wheel.name} is not a wheel file name", why=str(exc),
                           fix="publish the .whl that the build produced") from exc
    if not wheel.is_file():
        raise PublishError(f"{wheel} does not exist", fix="build the wheel first")
    try:
        with lock_wheelhouse(root, manifest.target or project, lock_timeout, wait):
            fault_point("locked")
            return _publish_locked(root, project, wheel, manifest, replace, tuple(Path(a) for a in attachments))
    except OSError as exc:
        raise os_error(exc, root, f"publish {wheel.name}") from None


def _publish_locked(root: Path, project: str, wheel: Path, manifest: Manifest, replace: bool,
                    attachments: tuple[Path, ...]) -> PublishedWheel:
    _remove_stale_temps(root)
    dest_dir = root / project
    public_dirs(dest_dir)
    final = dest_dir / wheel.name
    final_manifest = dest_dir / (wheel.name + MANIFEST_SUFFIX)
    fd, tmp_wheel = tempfile.mkstemp(dir=dest_dir, prefix=f"{TMP_MARK}{wheel.name}.")
    tmp_manifest = None
    try:
        sha, size = _copy_hashing(wheel, fd)
        os.chmod(tmp_wheel, PUBLIC_FILE_MODE)
        fault_point("wheel-temp")
        _refuse_same_name_elsewhere(root, project, wheel.name, sha)
        if final.is_file():
            old_sha = sha256_file(final)
            if old_sha != sha and not replace:
                raise PublishError(
                    f"{project}/{wheel.name} is already published with a different sha256",
                    why=f"published {old_sha[:12]}..., new {sha[:12]}...; one file name must mean one wheel "
                        "(pip caches wheels by name, and users who installed the old one would not notice)",
                    fix="give the new wheel another version or local label, or replace it on purpose with "
                        "--replace (kforge build --replace / kforge wheelhouse merge --replace)",
                )
        attached = _store_attachments(dest_dir, wheel.name, attachments)
        report = next((a for a in attached if a.endswith("/report.json")), manifest.report_path)
        done = Manifest(**{**_shallow(manifest), "sha256": sha, "size": size, "wheel": wheel.name,
                           "project": manifest.project or project, "attachments": attached, "report_path": report})
        mfd, tmp_manifest = tempfile.mkstemp(dir=dest_dir, prefix=f"{TMP_MARK}{final_manifest.name}.")
        with os.fdopen(mfd, "w", encoding="utf-8") as fh:
            fh.write(done.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_manifest, PUBLIC_FILE_MODE)
        fault_point("manifest-temp")
        pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
        if pause > 0:
            time.sleep(pause)
        # The manifest goes first: a manifest without its wheel is swept by the next publish or index (the
        # wheel never appeared); a wheel is never left without the record that says where it came from.
        os.replace(tmp_manifest, final_manifest)
        fault_point("manifest-renamed")
        os.replace(tmp_wheel, final)
        _fsync_dir(dest_dir)
        fault_point("wheel-renamed")
    finally:
        for leftover in (tmp_wheel, tmp_manifest):
            if leftover and os.path.exists(leftover):
                os.unlink(leftover)
    index = write_index(root)
    return PublishedWheel(project, final, final_manifest, done, index)


def _refuse_same_name_elsewhere(root: Path, project: str, filename: str, sha: str) -> None:
    """One file name means one wheel across the whole wheelhouse (the index lists them side by side)."""
    for other in _project_dirs(root):
        twin = other / filename
        if other.name != project and twin.is_file() and sha256_file(twin) != sha:
            raise PublishError(
                f"{filename} is already published by the project {other.name}, with other bytes",
                why="the index would list two different wheels under one file name, and pip would take either",
                fix=f"give one of them another version or local label (or remove {other.name}'s: "
                    f"kforge wheelhouse clean {other.name})",
            )


def _store_attachments(dest_dir: Path, wheel_name: str, attachments: tuple[Path, ...]) -> tuple[str, ...]:
    """Copy attachments into ``<wheel>.report/`` (each via a temp file + rename); return relative paths."""
    if not attachments:
        return ()
    folder = dest_dir / f"{wheel_name}{REPORT_SUFFIX}"
    public_dirs(folder)
    out = []
    for src in attachments:
        if not src.is_file():
            raise PublishError(f"the attachment {src} does not exist", fix="write the build report before publishing")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{TMP_MARK}{src.name}.")
        _copy_hashing(src, fd)
        os.chmod(tmp, PUBLIC_FILE_MODE)
        os.replace(tmp, folder / src.name)
        out.append(f"{folder.name}/{src.name}")
    return tuple(out)


def _shallow(m: Manifest) -> dict[str, Any]:
    return {f.name: getattr(m, f.name) for f in fields(m)}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_manifest(path: Path) -> Manifest:
    """Read one manifest; a corrupt one is a :class:`PublishError` naming the file and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PublishError(f"cannot read the manifest {path}: {exc.strerror}",
                           fix="check its permissions") from None
    try:
        return Manifest.from_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = f"it is not UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})"
    except (ValueError, TypeError) as exc:
        problem = f"it is not a kforge manifest ({exc})"
    raise PublishError(f"the manifest {path} is corrupt: {problem}", fix=_REPUBLISH)


_REPUBLISH = ("re-publish that wheel (kforge build <target> --replace), or remove the wheel and its manifest "
              "(kforge wheelhouse clean <project>) and run kforge wheelhouse index")


def _remove_stale_temps(root: Path) -> None:
    """Only called under the lock: temp files and wheel-less manifests belong to a publisher that died."""
    if not root.is_dir():
        return
    stale = [p for p in root.rglob(".*") if p.name.startswith(TMP_MARK) or (p.name.endswith(".tmp") and p.is_file())]
    for dest_dir in _project_dirs(root):
        stale += [m for m in dest_dir.glob(f"*.whl{MANIFEST_SUFFIX}")
                  if not (dest_dir / m.name[: -len(MANIFEST_SUFFIX)]).exists()]
    for path in stale:
        try:
            path.unlink()
        except OSError:
            pass


# --------------------------------------------------------------------------- reading, verifying


def scan(wheelhouse_root: Path, project: str | None = None) -> Scan:
    """Every wheel whose manifest agrees with it (name, size, recomputed sha256), and every problem found."""
    root = Path(wheelhouse_root)
    if root.exists() and not root.is_dir():
        raise PublishError(f"the wheelhouse {root} is a file, not a directory",
                           fix="point --wheelhouse / KFORGE_WHEELHOUSE at a directory")
    found: list[PublishedWheel] = []
    problems: list[Problem] = []
    for dest_dir in sorted(_project_dirs(root)):
        if project is not None and dest_dir.name != project:
            continue
        wheels = sorted(dest_dir.glob("*.whl"))
        names = {w.name for w in wheels}
        for orphan in sorted(dest_dir.glob(f"*.whl{MANIFEST_SUFFIX}")):
            if orphan.name[: -len(MANIFEST_SUFFIX)] not in names:
                problems.append(Problem(orphan, "a manifest without its wheel (a publish that did not finish?)",
                                        "kforge wheelhouse index sweeps it"))
        for wheel in wheels:
            manifest_path = dest_dir / (wheel.name + MANIFEST_SUFFIX)
            if not manifest_path.is_file():
                problems.append(Problem(wheel, "a wheel without a manifest (a publish that did not finish?)",
                                        "re-publish it, or remove it"))
                continue
            try:
                manifest = read_manifest(manifest_path)
            except PublishError as exc:
                problems.append(Problem(manifest_path, exc.what.split(": ", 1)[-1], _REPUBLISH))
                continue
            why = _disagreement(wheel, manifest)
            if why:
                problems.append(Problem(manifest_path, why, _REPUBLISH))
                continue
            found.append(PublishedWheel(dest_dir.name, wheel, manifest_path, manifest, root / INDEX_DIR / "index.html"))
    return Scan(tuple(found), tuple(problems))


def _disagreement(wheel: Path, manifest: Manifest) -> str | None:
    if manifest.wheel and manifest.wheel != wheel.name:
        return f"it describes {manifest.wheel}, not {wheel.name}"
    try:
        size = wheel.stat().st_size
    except OSError as exc:
        return f"the wheel cannot be read: {exc.strerror}"
    if not manifest.sha256:
        return "it records no sha256"
    if size != manifest.size:
        return f"it records {manifest.size} bytes and the wheel has {size}"
    try:
        actual = sha256_file(wheel)
    except OSError as exc:
        return f"the wheel cannot be read: {exc.strerror}"
    if actual != manifest.sha256:
        return f"it records sha256 {manifest.sha256[:12]}... and the wheel hashes to {actual[:12]}..."
    return None


def list_wheels(wheelhouse_root: Path, project: str | None = None) -> tuple[PublishedWheel, ...]:
    """Complete, verified wheels only (see :func:`scan` for what was left out and why)."""
    return scan(wheelhouse_root, project).wheels


def _project_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.is_dir() and entry.name != INDEX_DIR and not entry.name.startswith("."):
            yield entry


def verify(wheelhouse_root: Path) -> Scan:
    """Check a whole wheelhouse: every wheel, manifest, index page, link, hash and file mode."""
    root = Path(wheelhouse_root)
    if not root.is_dir():
        raise PublishError(f"the wheelhouse {root} does not exist", fix="build something first, or pass --wheelhouse")
    result = scan(root)
    problems = list(result.problems)
    expected = render_index(result.wheels)
    for rel, text in expected.items():
        page = root / rel
        try:
            have = page.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            problems.append(Problem(page, "the index page is missing or unreadable", "run kforge wheelhouse index"))
            continue
        if have != text:
            problems.append(Problem(page, "the index page does not list exactly the verified wheels",
                                    "run kforge wheelhouse index"))
    index_root = root / INDEX_DIR
    if index_root.is_dir():
        for page in sorted(index_root.glob("*/index.html")):
            if str(page.relative_to(root)) not in expected:
                problems.append(Problem(page, "an index page for a distribution with no verified wheel",
                                        "run kforge wheelhouse index"))
    for path in sorted(root.rglob("*")):
        if path.name.startswith(".kforge.lock") or path.is_symlink():
            continue
        if path.name.startswith(TMP_MARK):
            problems.append(Problem(path, "a temporary file of a publish that did not finish",
                                    "run kforge wheelhouse index (it sweeps them)"))
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        need = 0o555 if path.is_dir() else 0o444
        if mode & need != need:
            problems.append(Problem(path, f"mode {mode:04o} is not world-readable, so a web server running as "
                                          "another user can't serve it", f"chmod {'755' if path.is_dir() else '644'} it "
                                    "(kforge wheelhouse index fixes the modes)"))
    return Scan(result.wheels, tuple(problems))


# --------------------------------------------------------------------------- the index


def render_index(wheels: tuple[PublishedWheel, ...]) -> dict[str, str]:
    """The PEP 503 pages, in memory: {relative path under the root: html}."""
    by_name: dict[str, list[PublishedWheel]] = {}
    for w in wheels:
        name = str(canonicalize_name(parse_wheel_filename(w.filename)[0]))
        by_name.setdefault(name, []).append(w)
    pages: dict[str, str] = {}
    root_links = "\n".join(f'    <a href="{html.escape(n)}/">{html.escape(n)}</a><br/>' for n in sorted(by_name))
    pages[f"{INDEX_DIR}/index.html"] = _page("Simple index", root_links)
    for name, items in sorted(by_name.items()):
        links = "\n".join(
            f'    <a href="../../{html.escape(w.project)}/{html.escape(w.filename)}#sha256={w.sha256}">'
            f"{html.escape(w.filename)}</a><br/>"
            for w in sorted(items, key=lambda w: (w.filename, w.project))
        )
        pages[f"{INDEX_DIR}/{name}/index.html"] = _page(f"Links for {name}", links)
    return pages


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{body}\n  </body>\n</html>\n")


def write_index(root: Path, wheels: tuple[PublishedWheel, ...] | None = None) -> Path:
    """Write ``simple/``: distribution pages first, the root page next, stale pages last (see the module doc)."""
    if wheels is None:
        wheels = scan(root).wheels
    pages = render_index(wheels)
    index_root = root / INDEX_DIR
    root_rel = f"{INDEX_DIR}/index.html"
    for rel, text in pages.items():
        if rel == root_rel:
            continue
        public_dirs((root / rel).parent)
        atomic_write_text(root / rel, text)
        fault_point("index-page")
    public_dirs(index_root)
    atomic_write_text(root / root_rel, pages[root_rel])
    fault_point("index-root")
    keep = {(root / rel).parent for rel in pages}
    for sub in index_root.iterdir():
        if sub.is_dir() and sub not in keep:
            shutil.rmtree(sub, ignore_errors=True)
    fault_point("index-pruned")
    return index_root / "index.html"


def _fix_modes(root: Path) -> None:
    """Published files 0644, folders 0755 (a wheelhouse written by an older kforge had 0600 files)."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink() or path.name.startswith(".kforge.lock"):
            continue
        want = PUBLIC_DIR_MODE if path.is_dir() else PUBLIC_FILE_MODE
        if stat.S_IMODE(path.stat().st_mode) != want:
            os.chmod(path, want)


def rebuild_index(wheelhouse_root: Path, *, lock_timeout: float | None = None, wait: bool = True) -> Scan:
    """Regenerate ``simple/`` from the verified wheels, sweep stray temp files and fix file modes.

    Returns the scan; its ``problems`` name every wheel left out and why (the caller reports them).
    """
    root = Path(wheelhouse_root)
    try:
        with lock_wheelhouse(root, "wheelhouse index", lock_timeout, wait):
            _remove_stale_temps(root)
            result = scan(root)
            write_index(root, result.wheels)
            _fix_modes(root)
            return result
    except OSError as exc:
        raise os_error(exc, root, "rewrite the index") from None


def clean(wheelhouse_root: Path, project: str | None = None, *, lock_timeout: float | None = None,
          wait: bool = True) -> int:
    """Remove the wheels (and manifests) of ``project``, or of every project; return how many wheels went.

    The index stops listing them before their files go, so no link ever points at nothing.
    """
    root = Path(wheelhouse_root)
    if project is not None:
        _check_project(project)
    try:
        with lock_wheelhouse(root, "wheelhouse clean", lock_timeout, wait):
            doomed = [d for d in _project_dirs(root) if project is None or d.name == project]
            keep = tuple(w for w in scan(root).wheels if w.wheel.parent not in doomed)
            write_index(root, keep)
            removed = 0
            for dest_dir in doomed:
                removed += len(list(dest_dir.glob("*.whl")))
                shutil.rmtree(dest_dir)
            _remove_stale_temps(root)
    except OSError as exc:
        raise os_error(exc, root, "clean") from None
    return removed
