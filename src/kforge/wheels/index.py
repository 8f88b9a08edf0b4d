"""What a wheelhouse holds, checked: manifests read and compared with their wheels, and the PEP 503 index.

The reading half of the wheelhouse (:mod:`kforge.wheels.wheelhouse` writes: publish, clean, the lock). It trusts
nothing: :func:`scan` recomputes each wheel's sha256 and keeps a wheel only when its manifest agrees with
it (file name, size, sha256), naming every other one as a :class:`Problem`; :func:`verify` also checks the
index pages and the file modes; :func:`write_index` writes the pages so that each is, at every instant,
the old or the new one (distribution pages first, the root page next, stale pages last).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from kforge.errors import PublishError
from kforge.fsutil import PUBLIC_DIR_MODE, PUBLIC_FILE_MODE, atomic_write_text, sha256_file
from kforge.wheels import simpleindex

MANIFEST_SUFFIX = ".manifest.json"
REPORT_SUFFIX = ".report"
INDEX_DIR = "simple"
RELEASES_DIR = "releases"  # kforge release's manifests
#: Test hook for the fault suite: ``<point>[@<n>][:SIGINT]``; the process signals itself at the n-th pass
#: through that point (SIGKILL by default). Points: see :data:`FAULT_POINTS`.
FAULT_ENV = "KFORGE_TEST_FAULT"
FAULT_POINTS = ("locked", "wheel-temp", "manifest-temp", "manifest-renamed", "wheel-renamed",
                "index-page", "index-root", "index-pruned")
TMP_MARK = ".kforge-tmp-"


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
    variant: str | None = None  # the variant id, cu130-torch2.11-cp312 (kforge.config.variant)
    inputs_hash: str | None = None  # kforge.buildinputs: equal hashes, equal wheel (a release skips it)

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



# --------------------------------------------------------------------------- reading, verifying


def scan(wheelhouse_root: Path, project: str | None = None) -> Scan:
    """Every wheel whose manifest agrees with it (name, size, recomputed sha256), and every problem found."""
    root = Path(wheelhouse_root)
    if root.exists() and not root.is_dir():
        raise PublishError(f"the wheelhouse {root} is a file, not a directory",
                           fix="point --wheelhouse / KFORGE_WHEELHOUSE at a directory")
    found: list[PublishedWheel] = []
    problems: list[Problem] = []
    for dest_dir in sorted(project_dirs(root)):
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


def project_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if (entry.is_dir() and entry.name not in (INDEX_DIR, RELEASES_DIR) and not entry.name.startswith(".")
                and not simpleindex.is_variant_folder(entry.name)):
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


def index_entries(wheels: tuple[PublishedWheel, ...]) -> list[simpleindex.IndexEntry]:
    """The rows kforge.wheels.simpleindex renders (PEP 691 JSON pages, per-CUDA indexes)."""
    return [simpleindex.IndexEntry(name=str(canonicalize_name(parse_wheel_filename(w.filename)[0])), project=w.project,
                                   filename=w.filename, sha256=w.sha256,
                                   cuda_tag=simpleindex.cuda_tag(w.record.variant, (w.record.toolchain or {}).get("cuda")))
            for w in wheels]


def render_index(wheels: tuple[PublishedWheel, ...]) -> dict[str, str]:
    """Every index page, in memory: {relative path under the root: text}, rendered by kforge.wheels.simpleindex
    (the PEP 503 and PEP 691 pages of ``simple/`` and the per-CUDA indexes, ``cu130/simple/``)."""
    return simpleindex.all_pages(index_entries(wheels))


def write_index(root: Path, wheels: tuple[PublishedWheel, ...] | None = None) -> Path:
    """Write ``simple/``: distribution pages first, the root page next, stale pages last (see the module doc)."""
    if wheels is None:
        wheels = scan(root).wheels
    pages = render_index(wheels)
    index_root = root / INDEX_DIR
    root_rel = f"{INDEX_DIR}/index.html"

    def is_root_page(rel: str) -> bool:  # simple/index.*, cu130/simple/index.*: the pages that link the others
        return Path(rel).parent.name == INDEX_DIR

    for rel, text in pages.items():
        if is_root_page(rel):
            continue
        public_dirs((root / rel).parent)
        atomic_write_text(root / rel, text)
        fault_point("index-page")
    for rel, text in pages.items():
        if is_root_page(rel) and rel != root_rel:
            public_dirs((root / rel).parent)
            atomic_write_text(root / rel, text)
    public_dirs(index_root)
    atomic_write_text(root / root_rel, pages[root_rel])
    fault_point("index-root")
    keep = {(root / rel).parent for rel in pages}
    variant_indexes = [d / INDEX_DIR for d in root.iterdir() if d.is_dir() and simpleindex.is_variant_folder(d.name)]
    for index in (index_root, *variant_indexes):
        if index != index_root and index not in keep:  # a CUDA with no wheels left: its whole folder goes
            shutil.rmtree(index.parent, ignore_errors=True)
            continue
        for sub in index.iterdir() if index.is_dir() else ():
            if sub.is_dir() and sub not in keep:
                shutil.rmtree(sub, ignore_errors=True)
    fault_point("index-pruned")
    return index_root / "index.html"


def fix_modes(root: Path) -> None:
    """Published files 0644, folders 0755 (a wheelhouse written by an older kforge had 0600 files)."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink() or path.name.startswith(".kforge.lock"):
            continue
        want = PUBLIC_DIR_MODE if path.is_dir() else PUBLIC_FILE_MODE
        if stat.S_IMODE(path.stat().st_mode) != want:
            os.chmod(path, want)
