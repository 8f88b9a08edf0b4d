"""Preflight: before any compile, check that the build can finish where it will have to write.

A build that compiles for twenty minutes and then can't publish has wasted twenty minutes. So the first
step of every build checks, in a second or two:

1. the wheelhouse (when the build publishes): it can be created, locked and written (a probe file is written, synced and removed
   under the wheelhouse lock); a read-only, full or foreign-owned wheelhouse is a publish error (11);
2. the work folder (``.kforge/work``): it can be created and written; otherwise a build error (7);
3. the temp folder (``TMPDIR``, where nvcc and pip write their intermediate files) can be written and
   has :data:`TMP_MIN_BYTES` free; otherwise a build error (7);
4. disk space: the wheelhouse's disk has room for the expected wheel (the largest wheel earlier builds
   of the project published, from their manifests, else :data:`DEFAULT_WHEEL_BYTES`), and the work
   folder's disk for the expected build (:data:`WORK_FACTOR` wheels plus :data:`WORK_FLOOR_BYTES`);
   both counted once when they share a disk;
5. the toolchain the plan names: the nvcc of the plan's CUDA exists (or CUDA >= 13 can be provisioned
   from PyPI), the cmake backend's cmake is on PATH, and a torch-ABI project's interpreter has torch (4).

It also warns when the wheelhouse already holds a wheel of this target: a rebuild that produces the
same file name with other bytes will be refused at publish unless ``--replace``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kforge.build import toolchain
from kforge.build.host import HostFacts
from kforge.errors import BuildError, KforgeError, PublishError, ToolchainError, os_fix
from kforge.plan import PROVISIONABLE_FROM, Plan
from kforge.wheels import wheelhouse

#: The wheel size assumed when no earlier build of the project left a manifest.
DEFAULT_WHEEL_BYTES = 64 << 20
#: The work folder holds the source copy, objects, the wheel and its repaired and versioned copies.
WORK_FACTOR = 4
WORK_FLOOR_BYTES = 256 << 20
#: nvcc keeps each unit's intermediate files (ptx, cubin, fatbin) in TMPDIR.
TMP_MIN_BYTES = 64 << 20
_PROBE_BYTES = 4096


@dataclass(frozen=True)
class PreflightResult:
    wheelhouse: Path
    work: Path
    expected_wheel: int  # bytes
    expected_from: str  # "earlier builds" | "estimate"
    need_wheelhouse: int
    need_work: int
    free_wheelhouse: int
    free_work: int
    nvcc: str  # the nvcc path, or what will happen ("provision from PyPI", "not checked: ...")
    earlier: tuple[str, ...]  # wheels of this target already in the wheelhouse


def expected_wheel_bytes(wheelhouse_root: Path, project: str) -> tuple[int, str]:
    """The largest wheel of ``project`` earlier manifests recorded, else the default estimate."""
    sizes = []
    folder = Path(wheelhouse_root) / project
    if folder.is_dir():
        for manifest in folder.glob(f"*{wheelhouse.MANIFEST_SUFFIX}"):
            try:
                sizes.append(wheelhouse.read_manifest(manifest).size)
            except PublishError:
                continue  # `kforge wheelhouse verify` reports it; the estimate just skips it
    sizes = [s for s in sizes if s > 0]
    return (max(sizes), "earlier builds") if sizes else (DEFAULT_WHEEL_BYTES, "estimate")


def _existing_dir(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(folder: Path) -> None:
    """Write, sync and remove a small file in ``folder`` (raises OSError)."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=f"{wheelhouse.TMP_MARK}preflight.")
    try:
        os.write(fd, b"\0" * _PROBE_BYTES)
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(name)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def check_wheelhouse(root: Path, target: str, *, wait: bool = True) -> None:
    """The wheelhouse can be created, locked and written (:class:`PublishError` otherwise)."""
    try:
        with wheelhouse.lock_wheelhouse(root, target, None, wait):
            _probe(root)
    except OSError as exc:
        raise PublishError(f"the wheelhouse {root} cannot be written: {exc.strerror}",
                           why="checked before compiling, so the build would only have failed at publish",
                           fix=os_fix(exc.errno) + " (--wheelhouse / KFORGE_WHEELHOUSE)") from None


def check_work(work: Path) -> None:
    """The work folder's parent can be created and written (:class:`BuildError` otherwise)."""
    try:
        work.parent.mkdir(parents=True, exist_ok=True)
        _probe(work.parent)
    except OSError as exc:
        raise BuildError(f"the work folder {work.parent} cannot be written: {exc.strerror}",
                         why="builds copy the source and compile there",
                         fix=os_fix(exc.errno) + " (the work folder is <root>/.kforge/work)") from None


def check_tmp(environ: Mapping[str, str]) -> Path:
    """The temp folder nvcc and pip use can be written and has room (:class:`BuildError` otherwise).

    ``TMPDIR`` from the build's environment, as nvcc reads it (Python's own ``gettempdir`` would quietly
    fall back to another folder when that one is full).
    """
    tmp = Path(environ.get("TMPDIR") or tempfile.gettempdir())
    try:
        _probe(tmp)
        free = shutil.disk_usage(tmp).free
    except OSError as exc:
        raise BuildError(f"the temp folder {tmp} cannot be written: {exc.strerror}",
                         why="nvcc and pip write their intermediate files there (TMPDIR)",
                         fix=os_fix(exc.errno) + " (or set TMPDIR to a folder with room)") from None
    if free < TMP_MIN_BYTES:
        raise BuildError(f"the temp folder {tmp} has {_mib(free)} free, and the build needs {_mib(TMP_MIN_BYTES)}",
                         why="nvcc and pip write their intermediate files there (TMPDIR)",
                         fix="free space there, or set TMPDIR to a folder with room")
    return tmp


def check_space(root: Path, work: Path, expected: int, source: str) -> tuple[int, int, int, int]:
    """(need in wheelhouse, need in work, free there, free here); raises when a disk is too full."""
    need_wh = expected + (1 << 20)
    need_work = WORK_FACTOR * expected + WORK_FLOOR_BYTES
    wh_dir, work_dir = _existing_dir(root), _existing_dir(work)
    free_wh = shutil.disk_usage(wh_dir).free
    free_work = shutil.disk_usage(work_dir).free
    same_disk = os.stat(wh_dir).st_dev == os.stat(work_dir).st_dev
    basis = f"the expected wheel is {_mib(expected)} ({source})"
    if same_disk and free_wh < need_wh + need_work:
        raise BuildError(f"not enough free space for the build: {_mib(free_wh)} free on the disk of {wh_dir}, "
                         f"{_mib(need_wh + need_work)} needed", why=basis + "; the work folder and the wheelhouse "
                         "share that disk", fix=os_fix(28))
    if free_wh < need_wh:
        raise PublishError(f"not enough free space in the wheelhouse {root}: {_mib(free_wh)} free, "
                           f"{_mib(need_wh)} needed", why=basis, fix=os_fix(28) + " (--wheelhouse)")
    if free_work < need_work:
        raise BuildError(f"not enough free space for the work folder {work.parent}: {_mib(free_work)} free, "
                         f"{_mib(need_work)} needed", why=basis, fix=os_fix(28))
    return need_wh, need_work, free_wh, free_work


def check_toolchain(plan: Plan, host: HostFacts, environ: Mapping[str, str]) -> str:
    """The nvcc of the plan's CUDA exists (or will be provisioned); a torch-ABI build has torch."""
    if plan.target.platform != host.platform:
        return f"not checked: a {plan.target.platform} build"
    cuda = str(plan.toolchain.cuda)
    try:
        nvcc = toolchain.find_nvcc(environ, cuda=cuda).path
        where = str(nvcc)
    except ToolchainError as exc:
        if plan.toolchain.cuda < PROVISIONABLE_FROM:
            raise ToolchainError(exc.what, why=(exc.why or "") + "; checked before compiling", fix=exc.fix) from None
        where = f"provision nvidia-cuda-nvcc=={cuda}.* from PyPI"
    if plan.backend == "cmake" and not shutil.which("cmake", path=environ.get("PATH")):
        raise ToolchainError("cmake is not on the build's PATH", why="the cmake backend runs cmake; checked before "
                             "compiling", fix="install CMake >= 3.18 (e.g. pip install cmake) or use --backend native")
    provisioned = plan.provisioning is not None and plan.provisioning.env_needed  # torch comes with the variant's env
    if plan.project.torch_abi and host.torch_version is None and not provisioned:
        raise ToolchainError(f"{plan.project.name} builds against torch, and this interpreter has no torch",
                             why="checked before compiling", fix=f"install torch {plan.toolchain.torch or ''} into the "
                             "interpreter that runs kforge (the build uses no isolation)".replace("  ", " "))
    return where


def run(plan: Plan, host: HostFacts, *, wheelhouse_root: Path, work: Path, environ: Mapping[str, str],
        wait: bool = True) -> PreflightResult:
    """Every check above, cheapest first; raises the first failure's :class:`KforgeError`."""
    root = Path(wheelhouse_root)
    publishes = plan.makes_wheel  # the cmake backend's C library is verified, not published
    if publishes:
        check_wheelhouse(root, plan.id, wait=wait)
    check_work(work)
    check_tmp(environ)
    expected, source = expected_wheel_bytes(root, plan.project.name)
    need_wh, need_work, free_wh, free_work = check_space(root if publishes else work.parent, work, expected, source)
    nvcc = check_toolchain(plan, host, environ)
    earlier = tuple(sorted(str(p.relative_to(root)) for p in (root / plan.project.name).glob("*.whl")
                           if _target_of(p) == plan.id)) if (root / plan.project.name).is_dir() else ()
    return PreflightResult(root, work, expected, source, need_wh, need_work, free_wh, free_work, nvcc, earlier)


def _target_of(wheel: Path) -> str | None:
    try:
        return wheelhouse.read_manifest(wheel.parent / (wheel.name + wheelhouse.MANIFEST_SUFFIX)).target
    except KforgeError:
        return None


def describe(result: PreflightResult) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(info lines, warnings) for the build log."""
    info = (
        f"wheelhouse {result.wheelhouse}: writable, {_mib(result.free_wheelhouse)} free "
        f"(needs {_mib(result.need_wheelhouse)}: {result.expected_from})",
        f"work {result.work.parent}: writable, {_mib(result.free_work)} free (needs {_mib(result.need_work)})",
        f"nvcc: {result.nvcc}",
    )
    warnings = tuple(
        f"{name} is already published for this target: if this build makes the same file name with other bytes, "
        "publish refuses it (pass --replace to replace it on purpose)" for name in result.earlier)
    return info, warnings
