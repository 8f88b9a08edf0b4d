"""Facts about the machine a plan is made on, gathered once and passed in (never at import time)."""

from __future__ import annotations

import platform as _platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace

from packaging.version import Version

from kforge.arch import Arch, host_arch
from kforge.errors import KforgeError


@dataclass(frozen=True)
class HostFacts:
    platform: str  # a forge.toml platform name, e.g. linux-x86_64
    python: str  # "3.11"
    cpus: int
    mem_available: int  # bytes, now
    mem_total: int
    cuda_version: Version | None = None  # the nvcc kforge found, if any
    nvcc_path: str | None = None
    cuda_home: str | None = None
    nvcc_archs: frozenset[str] | None = None  # `nvcc --list-gpu-arch`
    torch_version: Version | None = None
    torch_cuda: str | None = None
    torch_cxx11_abi: bool | None = None
    gpu_arch: Arch | None = None  # the first visible GPU, if any
    gpu_name: str | None = None

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
    from kforge import jobs, toolchain
    from kforge.errors import ToolchainError

    res = jobs.detect_resources()
    facts = HostFacts(
        platform=platform_name(),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        cpus=res.cpus,
        mem_available=res.mem_available,
        mem_total=res.mem_total,
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
    return facts.with_(gpu_arch=gpu, gpu_name=name)


def with_torch(facts: HostFacts, python: str) -> HostFacts:
    """Add the torch that ``python`` imports (a subprocess: seconds, so only for torch-ABI projects)."""
    from kforge import toolchain

    torch = toolchain.detect_torch(python)
    if torch is None:
        return facts
    return facts.with_(torch_version=torch.version, torch_cuda=torch.cuda, torch_cxx11_abi=torch.cxx11_abi)
