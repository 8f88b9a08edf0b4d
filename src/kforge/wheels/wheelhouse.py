"""The wheelhouse: wheels with their provenance, and a PEP 503 index pip can install from.

Layout under the wheelhouse root::

    <project>/<wheel>                     the wheel
    <project>/<wheel>.manifest.json       where it came from (the commit record)
    simple/index.html                     PEP 503 root: one link per distribution
    simple/<normalized-name>/index.html   links ../../<project>/<wheel>#sha256=<hex>
    simple/**/index.v1_json               the same as PEP 691 JSON (kforge.wheels.simpleindex)
    cu130/simple/...                      the index of the wheels built with CUDA 13.0 (one per CUDA)
    releases/<project>.json               kforge release's manifest

This module writes (publish, index, clean, under the lock); :mod:`kforge.wheels.index` reads and checks.
Publishing is atomic. Under one lock (``.kforge.lock``, see :mod:`kforge.locking`), the wheel and its
manifest are copied to temporary files beside their final names, then renamed into place (manifest
first, wheel last: a manifest whose wheel never arrived is swept under the next lock), then the index is
regenerated. The wheelhouse verifies, never trusts: every index rewrite recomputes each wheel's sha256
and lists a wheel only when its manifest agrees (file name, size and sha256); a disagreeing or
unreadable manifest is reported by name (:class:`Problem`) and its wheel left out. Index pages are each
written atomically, distribution pages before the root page and stale pages removed last, so at every
instant each page is the old or the new one and every link resolves to a complete wheel whose bytes
match the link's hash. Two different wheels with one file name are refused
(``replace=True`` replaces on purpose). Published files are 0644 and folders 0755 whatever the umask, so
a web server running as another user can serve them (``python -m http.server`` in the root).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from kforge import locking
from kforge.errors import PublishError, os_fix
from kforge.fsutil import PUBLIC_FILE_MODE, sha256_file
from kforge.wheels.index import (
    FAULT_ENV,
    FAULT_POINTS,
    INDEX_DIR,
    MANIFEST_SUFFIX,
    REPORT_SUFFIX,
    TMP_MARK,
    Manifest,
    Problem,
    PublishedWheel,
    Scan,
    fault_point,
    fix_modes,
    list_wheels,
    project_dirs,
    public_dirs,
    read_manifest,
    render_index,
    scan,
    verify,
    write_index,
)

#: The reading half lives in kforge.wheels.index; these names are the wheelhouse's API too.
__all__ = ["FAULT_ENV", "FAULT_POINTS", "INDEX_DIR", "LOCK_NAME", "MANIFEST_SUFFIX", "PAUSE_ENV", "REPORT_SUFFIX",
           "TMP_MARK", "Manifest", "Problem", "PublishedWheel", "Scan", "clean", "fault_point", "list_wheels",
           "lock_wheelhouse", "make_root", "os_error", "public_dirs", "publish", "read_manifest", "rebuild_index",
           "render_index", "scan", "verify", "write_index"]

LOCK_NAME = ".kforge.lock"
#: Test hook: seconds to sleep after the temp files are written and before they are renamed.
PAUSE_ENV = "KFORGE_TEST_PUBLISH_PAUSE"
_BLOCK = 1 << 20


# --------------------------------------------------------------------------- small helpers


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
    for other in project_dirs(root):
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


def _remove_stale_temps(root: Path) -> None:
    """Only called under the lock: temp files and wheel-less manifests belong to a publisher that died."""
    if not root.is_dir():
        return
    stale = [p for p in root.rglob(".*") if p.name.startswith(TMP_MARK) or (p.name.endswith(".tmp") and p.is_file())]
    for dest_dir in project_dirs(root):
        stale += [m for m in dest_dir.glob(f"*.whl{MANIFEST_SUFFIX}")
                  if not (dest_dir / m.name[: -len(MANIFEST_SUFFIX)]).exists()]
    for path in stale:
        try:
            path.unlink()
        except OSError:
            pass


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
            fix_modes(root)
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
            doomed = [d for d in project_dirs(root) if project is None or d.name == project]
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
