"""The wheelhouse: wheels with their provenance, and a PEP 503 index pip can install from.

Layout under the wheelhouse root::

    <project>/<wheel>                     the wheel
    <project>/<wheel>.manifest.json       where it came from (the commit record)
    simple/index.html                     PEP 503 root: one link per distribution
    simple/<normalized-name>/index.html   links ../../<project>/<wheel>#sha256=<hex>
    simple/**/index.v1_json               the same as PEP 691 JSON (kforge.simpleindex)
    cu130/simple/...                      the index of the wheels built with CUDA 13.0 (one per CUDA)
    releases/<project>.json               kforge release's manifest

Publishing is atomic. Under one file lock (``.kforge.lock``), the wheel and its manifest
are copied to temporary files beside their final names, then renamed into place (wheel
first, manifest last), then the index is regenerated (each page written to a temp file and
renamed). The index lists a wheel only when both the wheel and its manifest are present
and the wheel's size matches the manifest. So a publisher killed at any point leaves at
worst stray temp files (removed by the next publish or ``rebuild_index``) and never an
index that points at nothing. The index works from ``file://`` and over plain HTTP
(``python -m http.server`` in the root).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)

from kforge import simpleindex
from kforge.errors import PublishError

LOCK_NAME = ".kforge.lock"
MANIFEST_SUFFIX = ".manifest.json"
INDEX_DIR = "simple"
RELEASES_DIR = "releases"  # kforge release's manifests
#: Test hook: seconds to sleep after the temp files are written and before they are renamed.
PAUSE_ENV = "KFORGE_TEST_PUBLISH_PAUSE"
_TMP_MARK = ".kforge-tmp-"


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
    sdist_sha256: str | None = None
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
    variant: str | None = None  # the variant id, cu130-torch2.11-cp312 (kforge.variant)
    inputs_hash: str | None = None  # kforge.buildinputs: equal hashes, equal wheel (a release skips it)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        for key in ("archs", "patches", "attachments"):
            if key in data and data[key] is not None:
                data[key] = tuple(data[key])
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


def _lock(root: Path, timeout: float) -> FileLock:
    if root.exists() and not root.is_dir():
        raise PublishError(f"the wheelhouse {root} is a file, not a directory", fix="point --wheelhouse / KFORGE_WHEELHOUSE at a directory")
    root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / LOCK_NAME), timeout=timeout)


def _check_project(project: str) -> None:
    if not project or project in (".", "..", INDEX_DIR) or "/" in project or "\\" in project or project.startswith("."):
        raise PublishError(f"'{project}' cannot be a wheelhouse folder name",
                           fix="use the kforge project name, e.g. fmha or flash-attn")


def _copy_hashing(src: Path, dst_fd: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, os.fdopen(dst_fd, "wb") as fout:
        while block := fin.read(1 << 20):
            digest.update(block)
            fout.write(block)
            size += len(block)
        fout.flush()
        os.fsync(fout.fileno())
    return digest.hexdigest(), size


def publish(
    wheelhouse_root: Path,
    project: str,
    wheel: Path,
    manifest: Manifest,
    *,
    replace: bool = False,
    attachments: tuple[Path, ...] | list[Path] = (),
    lock_timeout: float = 600.0,
) -> PublishedWheel:
    """Store ``wheel`` and its manifest under ``<root>/<project>/`` and refresh the index, atomically.

    ``attachments`` (the build report, its timeline) are stored in ``<wheel>.report/`` and
    linked from the manifest (``report_path`` is the one named ``report.json``).
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
        with _lock(root, lock_timeout):
            return _publish_locked(root, project, wheel, manifest, replace, tuple(Path(a) for a in attachments))
    except Timeout as exc:
        raise PublishError(f"the wheelhouse {root} stayed locked for {lock_timeout:.0f} s",
                           why=f"another kforge process holds {root / LOCK_NAME}",
                           fix="wait for it to finish; if none is running, delete the lock file") from exc


def _publish_locked(root: Path, project: str, wheel: Path, manifest: Manifest, replace: bool,
                    attachments: tuple[Path, ...]) -> PublishedWheel:
    _remove_stale_temps(root)
    dest_dir = root / project
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / wheel.name
    final_manifest = dest_dir / (wheel.name + MANIFEST_SUFFIX)
    fd, tmp_wheel = tempfile.mkstemp(dir=dest_dir, prefix=f"{_TMP_MARK}{wheel.name}.")
    tmp_manifest = None
    try:
        sha, size = _copy_hashing(wheel, fd)
        old = _read_manifest(final_manifest)
        if old is not None and final.is_file() and old.sha256 != sha and not replace:
            raise PublishError(
                f"{project}/{wheel.name} is already published with a different sha256",
                why=f"published {old.sha256[:12]}..., new {sha[:12]}...; pip caches wheels by name and hash",
                fix="bump the version or local label, or publish with replace=True (kforge wheelhouse clean first)",
            )
        attached = _store_attachments(dest_dir, wheel.name, attachments)
        report = next((a for a in attached if a.endswith("/report.json")), manifest.report_path)
        done = Manifest(**{**_shallow(manifest), "sha256": sha, "size": size, "wheel": wheel.name,
                           "project": manifest.project or project, "attachments": attached, "report_path": report})
        mfd, tmp_manifest = tempfile.mkstemp(dir=dest_dir, prefix=f"{_TMP_MARK}{final_manifest.name}.")
        with os.fdopen(mfd, "w") as fh:
            fh.write(done.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
        if pause > 0:
            time.sleep(pause)
        os.replace(tmp_wheel, final)
        os.replace(tmp_manifest, final_manifest)
        _fsync_dir(dest_dir)
    finally:
        for leftover in (tmp_wheel, tmp_manifest):
            if leftover and os.path.exists(leftover):
                os.unlink(leftover)
    index = _write_index(root)
    return PublishedWheel(project, final, final_manifest, done, index)


def _store_attachments(dest_dir: Path, wheel_name: str, attachments: tuple[Path, ...]) -> tuple[str, ...]:
    """Copy attachments into ``<wheel>.report/`` (each via a temp file + rename); return relative paths."""
    if not attachments:
        return ()
    folder = dest_dir / f"{wheel_name}.report"
    folder.mkdir(exist_ok=True)
    out = []
    for src in attachments:
        if not src.is_file():
            raise PublishError(f"the attachment {src} does not exist", fix="write the build report before publishing")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{_TMP_MARK}{src.name}.")
        _copy_hashing(src, fd)
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


def _read_manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None


def _remove_stale_temps(root: Path) -> None:
    """Only called under the lock: any temp file now belongs to a publisher that died."""
    if not root.is_dir():
        return
    for path in root.rglob(f"{_TMP_MARK}*"):
        try:
            path.unlink()
        except OSError:
            pass


def list_wheels(wheelhouse_root: Path, project: str | None = None) -> tuple[PublishedWheel, ...]:
    """Complete wheels only: wheel and manifest present, size as recorded."""
    root = Path(wheelhouse_root)
    found: list[PublishedWheel] = []
    for dest_dir in sorted(_project_dirs(root)):
        if project is not None and dest_dir.name != project:
            continue
        for wheel in sorted(dest_dir.glob("*.whl")):
            manifest_path = dest_dir / (wheel.name + MANIFEST_SUFFIX)
            manifest = _read_manifest(manifest_path)
            if manifest is None or not manifest.sha256:
                continue
            try:
                if wheel.stat().st_size != manifest.size:
                    continue
            except OSError:
                continue
            found.append(PublishedWheel(dest_dir.name, wheel, manifest_path, manifest, root / INDEX_DIR / "index.html"))
    return tuple(found)


def _project_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if (entry.is_dir() and entry.name not in (INDEX_DIR, RELEASES_DIR) and not entry.name.startswith(".")
                and not simpleindex.is_variant_folder(entry.name)):
            yield entry


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
            for w in sorted(items, key=lambda w: w.filename)
        )
        pages[f"{INDEX_DIR}/{name}/index.html"] = _page(f"Links for {name}", links)
    return pages


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{body}\n  </body>\n</html>\n")


def index_entries(wheels: tuple[PublishedWheel, ...]) -> list[simpleindex.IndexEntry]:
    """The rows kforge.simpleindex renders (PEP 691 JSON pages, per-CUDA indexes)."""
    return [simpleindex.IndexEntry(name=str(canonicalize_name(parse_wheel_filename(w.filename)[0])), project=w.project,
                                   filename=w.filename, sha256=w.sha256,
                                   cuda_tag=simpleindex.cuda_tag(w.record.variant, (w.record.toolchain or {}).get("cuda")))
            for w in wheels]


def _write_index(root: Path) -> Path:
    wheels = list_wheels(root)
    pages = {**render_index(wheels), **simpleindex.all_pages(index_entries(wheels))}
    index_root = root / INDEX_DIR
    for rel, text in pages.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{_TMP_MARK}index.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    # drop pages of distributions (and per-CUDA indexes) that have no wheels any more
    keep = {(root / rel).parent for rel in pages}
    for index in [index_root] + [d / INDEX_DIR for d in root.iterdir() if simpleindex.is_variant_folder(d.name)]:
        if index.parent != root and index not in keep:
            shutil.rmtree(index.parent, ignore_errors=True)
            continue
        if index.is_dir():
            for sub in index.iterdir():
                if sub.is_dir() and sub not in keep:
                    shutil.rmtree(sub, ignore_errors=True)
    return index_root / "index.html"


def rebuild_index(wheelhouse_root: Path, *, lock_timeout: float = 600.0) -> Path:
    """Regenerate ``simple/`` from the complete wheels (and drop stray temp files); return simple/index.html."""
    root = Path(wheelhouse_root)
    try:
        with _lock(root, lock_timeout):
            _remove_stale_temps(root)
            return _write_index(root)
    except Timeout as exc:
        raise PublishError(f"the wheelhouse {root} stayed locked for {lock_timeout:.0f} s",
                           fix="wait for the other kforge process to finish") from exc


def clean(wheelhouse_root: Path, project: str | None = None, *, lock_timeout: float = 600.0) -> int:
    """Remove the wheels (and manifests) of ``project``, or of every project; return how many wheels went."""
    root = Path(wheelhouse_root)
    if project is not None:
        _check_project(project)
    removed = 0
    try:
        with _lock(root, lock_timeout):
            for dest_dir in list(_project_dirs(root)):
                if project is not None and dest_dir.name != project:
                    continue
                removed += len(list(dest_dir.glob("*.whl")))
                shutil.rmtree(dest_dir)
            _remove_stale_temps(root)
            _write_index(root)
    except Timeout as exc:
        raise PublishError(f"the wheelhouse {root} stayed locked for {lock_timeout:.0f} s",
                           fix="wait for the other kforge process to finish") from exc
    return removed
