"""Gather the facts about this machine a plan needs (platform, cores, memory, nvcc, torch, GPU), once, passed in.

Nothing is detected at import time: :func:`detect_host` returns a frozen :class:`HostFacts` that the
caller hands to the plan, and tests build their own. :class:`Resources` (cores and memory) is the
part the job model (:mod:`kforge.build.jobs`) reads.
"""

from __future__ import annotations

import ctypes
import os
import platform as _platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import Version

from kforge.build import distplan, toolchain
from kforge.build.venv import find_uv
from kforge.cuda.arch import Arch, host_arch
from kforge.errors import KforgeError, ToolchainError

GiB = 1024**3
GB = 1000**3

@dataclass(frozen=True)
class Resources:
    """What the build machine offers right now."""

    cpus: int
    mem_available: int  # bytes, usable now (MemAvailable, or the cgroup's room if lower)
    mem_total: int  # bytes
    source: str = "given"
    unit_overhead: float = 0.0  # seconds a unit spends outside the compilers that run it (a cluster's client and wire)

    def describe(self) -> str:
        extra = f"; {self.unit_overhead:.1f} s a unit outside the compilers" if self.unit_overhead else ""
        return (
            f"{self.cpus} cpus, {self.mem_available / GB:.1f} GB available of "
            f"{self.mem_total / GB:.1f} GB ({self.source}{extra})"
        )


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text in ("", "max"):
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _meminfo(proc: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (proc / "meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            value = int(parts[0])
            out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1].lower() == "kb" else value
    return out


def _cgroup_room(proc: Path, sys_fs_cgroup: Path) -> tuple[int | None, int | None]:
    """(room left, limit) from the cgroup v2 (or v1) memory controller of this process."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        rel = path.lstrip("/")
        if hier == "0" and controllers == "":  # v2 unified
            base = sys_fs_cgroup / rel
            limit, current = _read_int(base / "memory.max"), _read_int(base / "memory.current")
        elif "memory" in controllers.split(","):  # v1
            base = sys_fs_cgroup / "memory" / rel
            limit, current = _read_int(base / "memory.limit_in_bytes"), _read_int(base / "memory.usage_in_bytes")
            if limit is not None and limit >= 1 << 60:  # v1 says "unlimited" with a huge number
                limit = None
        else:
            continue
        if limit is not None:
            return max(0, limit - (current or 0)), limit
    return None, None


class _MemoryStatusEx(ctypes.Structure):
    """Windows' MEMORYSTATUSEX."""

    _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong)] + [
        (name, ctypes.c_ulonglong) for name in ("ullTotalPhys", "ullAvailPhys", "ullTotalPageFile", "ullAvailPageFile",
                                                 "ullTotalVirtual", "ullAvailVirtual", "ullAvailExtendedVirtual")]


def global_memory_status() -> tuple[int, int] | None:
    """(available, total) bytes of physical memory from Windows' GlobalMemoryStatusEx; None elsewhere."""
    windll = getattr(ctypes, "windll", None)
    if windll is None:
        return None
    status = _MemoryStatusEx()
    status.dwLength = ctypes.sizeof(status)
    if not windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        return None
    return int(status.ullAvailPhys), int(status.ullTotalPhys)


def detect_resources(
    *,
    proc: Path = Path("/proc"),
    sys_fs_cgroup: Path = Path("/sys/fs/cgroup"),
    affinity: Callable[[int], set[int]] | None = None,
    memory_status: Callable[[], tuple[int, int] | None] = global_memory_status,
) -> Resources:
    """Read cpus (scheduler affinity) and memory (MemAvailable, lowered to the cgroup's room).

    Without ``/proc/meminfo`` (Windows), memory comes from ``memory_status`` (GlobalMemoryStatusEx).
    """
    aff = affinity or getattr(os, "sched_getaffinity", None)
    cpus = len(aff(0)) if aff else (os.cpu_count() or 1)
    if not (proc / "meminfo").is_file():
        mem = memory_status()
        if mem is None:
            raise KforgeError(f"cannot tell how much memory this machine has: no {proc / 'meminfo'}, no GlobalMemoryStatusEx",
                              fix="pass --max-jobs N (and --nvcc-threads N) to choose the build's parallelism yourself")
        return Resources(cpus=max(1, cpus), mem_available=mem[0], mem_total=mem[1], source="GlobalMemoryStatusEx")
    info = _meminfo(proc)
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    source = "/proc/meminfo MemAvailable"
    room, limit = _cgroup_room(proc, sys_fs_cgroup)
    if room is not None and room < available:
        available, source = room, "cgroup memory limit"
    if limit is not None and limit < total:
        total = limit
    return Resources(cpus=max(1, cpus), mem_available=available, mem_total=total, source=source)



@dataclass(frozen=True)
class HostFacts:
    platform: str  # a forge.toml platform name, e.g. linux-x86_64
    python: str  # "3.11"
    resources: Resources  # cores and memory, now
    cuda_version: Version | None = None  # the nvcc kforge found, if any
    nvcc_path: str | None = None
    cuda_home: str | None = None
    nvcc_archs: frozenset[str] | None = None  # `nvcc --list-gpu-arch`
    torch_version: Version | None = None
    gpu_arch: Arch | None = None  # the first visible GPU, if any
    gpu_name: str | None = None
    uv: str | None = None  # uv's path, which a variant environment is made with (None: not found)
    glibc: str | None = None  # "2.36": the C library wheels linked here need (None: not glibc)
    dist: distplan.DistCluster | None = None  # the sccache-dist cluster this build's compiles go to (None: none)

    @property
    def cpus(self) -> int:
        return self.resources.cpus

    @property
    def mem_available(self) -> int:
        return self.resources.mem_available

    @property
    def mem_total(self) -> int:
        return self.resources.mem_total

    def with_(self, **changes: object) -> HostFacts:
        return replace(self, **changes)


def platform_name(sys_platform: str | None = None, machine: str | None = None) -> str:
    """Map Python's platform strings onto forge.toml's platform names."""
    sys_platform = sys_platform or sys.platform
    machine = (machine or _platform.machine()).lower()
    if sys_platform.startswith("win"):
        return "windows-amd64" if machine in ("amd64", "x86_64") else f"windows-{machine}"
    if sys_platform.startswith("linux"):
        return {"x86_64": "linux-x86_64", "amd64": "linux-x86_64", "aarch64": "linux-aarch64", "arm64": "linux-aarch64"}.get(
            machine, f"linux-{machine}"
        )
    return f"{sys_platform}-{machine}"


def detect_gpu(which=shutil.which) -> tuple[Arch | None, str | None]:
    """The first GPU's arch and name from ``nvidia-smi`` (no torch needed); (None, None) without one."""
    smi = which("nvidia-smi")
    if not smi:
        return None, None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap,name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    for line in out.splitlines():
        cap, _, name = line.partition(",")
        major, _, minor = cap.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            try:
                return host_arch((int(major), int(minor))), name.strip()
            except KforgeError:  # a V100, or a GPU newer than the table: no arch to build for, but say which
                return None, f"{name.strip()} (compute capability {major}.{minor}, not in kforge's arch table)"
    return None, None


def detect_host(environ: Mapping[str, str], *, python: str | None = None, probe_torch: bool = False) -> HostFacts:
    """Gather every fact a plan needs: nvcc, torch, cores and memory, and the GPU."""
    facts = HostFacts(
        platform=platform_name(),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        resources=detect_resources(),
    )
    try:
        nvcc = toolchain.find_nvcc(environ)
    except ToolchainError:
        nvcc = None
    if nvcc is not None:
        facts = facts.with_(
            cuda_version=nvcc.version, nvcc_path=str(nvcc.path), cuda_home=str(nvcc.home), nvcc_archs=nvcc.gpu_archs
        )
    if probe_torch:
        facts = with_torch(facts, python or sys.executable)
    gpu, name = detect_gpu()
    try:
        uv: str | None = find_uv(environ)
    except ToolchainError:
        uv = None
    return facts.with_(gpu_arch=gpu, gpu_name=name, uv=uv, glibc=detect_glibc(), dist=distplan.detect(environ))


def detect_glibc(confstr: Callable[[str], str | None] | None = None) -> str | None:
    """This process's glibc, ``"2.36"`` (None on musl, Windows, macOS); ``confstr`` stands in for os.confstr."""
    confstr = confstr or getattr(os, "confstr", None)
    try:
        text = confstr("CS_GNU_LIBC_VERSION") if confstr else None
    except (ValueError, OSError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    return text.split()[1]


def with_torch(facts: HostFacts, python: str) -> HostFacts:
    """Add the torch that ``python`` imports (a subprocess: seconds, so only for torch-ABI projects)."""
    torch = toolchain.detect_torch(python)
    return facts if torch is None else facts.with_(torch_version=torch.version)
