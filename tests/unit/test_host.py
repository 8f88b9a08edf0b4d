"""Host facts: cores and memory (fake /proc and cgroup trees), and the GPU as nvidia-smi reports it (a fake script)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.build.host import GiB, detect_gpu, detect_resources, platform_name
from kforge.errors import KforgeError


def fake_smi(tmp_path: Path, line: str):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(0o755)
    return lambda name: str(smi) if name == "nvidia-smi" else None


@pytest.mark.parametrize(
    ("line", "arch", "name_part"),
    [
        ("9.0, NVIDIA H100 80GB HBM3", "sm_90", "H100"),
        ("12.0, NVIDIA RTX PRO 6000", "sm_120", "RTX PRO 6000"),
        ("7.0, Tesla V100-SXM2-16GB", None, "compute capability 7.0"),  # CUDA 13 dropped it: no arch, no crash
        ("13.0, Some Future GPU", None, "not in kforge's arch table"),
    ],
)
def test_detect_gpu(tmp_path: Path, line: str, arch: str | None, name_part: str) -> None:
    got, name = detect_gpu(which=fake_smi(tmp_path, line))
    assert (got.sm if got else None) == arch
    assert name_part in name


def test_no_nvidia_smi_means_no_gpu() -> None:
    assert detect_gpu(which=lambda name: None) == (None, None)


@pytest.mark.parametrize(
    ("sys_platform", "machine", "name"),
    [("linux", "x86_64", "linux-x86_64"), ("linux", "aarch64", "linux-aarch64"), ("win32", "AMD64", "windows-amd64")],
)
def test_platform_name(sys_platform: str, machine: str, name: str) -> None:
    assert platform_name(sys_platform, machine) == name


# ---------------------------------------------------------------------------- detect_resources


def _fake_proc(tmp: Path, *, total_kb: int, avail_kb: int, cgroup: str) -> Path:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:        1000 kB\nMemAvailable:   {avail_kb} kB\nBuffers: 1 kB\n"
    )
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def test_detect_resources_reads_meminfo_and_affinity(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, total_kb=64 * 1024**2, avail_kb=48 * 1024**2, cgroup="0::/\n")
    host = detect_resources(proc=proc, sys_fs_cgroup=tmp_path / "cg", affinity=lambda pid: {0, 1, 2, 5})
    assert host.cpus == 4
    assert host.mem_total == 64 * GiB
    assert host.mem_available == 48 * GiB
    assert "MemAvailable" in host.source


def test_detect_resources_without_proc_meminfo_asks_windows(tmp_path: Path) -> None:
    """A Windows runner has no /proc/meminfo: memory comes from GlobalMemoryStatusEx (injected here)."""
    host = detect_resources(proc=tmp_path / "no-proc", sys_fs_cgroup=tmp_path / "cg", affinity=lambda pid: {0, 1},
                            memory_status=lambda: (6 * GiB, 16 * GiB))
    assert (host.cpus, host.mem_available, host.mem_total, host.source) == (2, 6 * GiB, 16 * GiB, "GlobalMemoryStatusEx")
    with pytest.raises(KforgeError, match="--max-jobs"):
        detect_resources(proc=tmp_path / "no-proc", sys_fs_cgroup=tmp_path / "cg", memory_status=lambda: None)


def test_detect_resources_lowers_to_cgroup_v2_room(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, total_kb=64 * 1024**2, avail_kb=48 * 1024**2, cgroup="0::/build.slice\n")
    cg = tmp_path / "cg" / "build.slice"
    cg.mkdir(parents=True)
    (cg / "memory.max").write_text(str(16 * GiB))
    (cg / "memory.current").write_text(str(4 * GiB))
    host = detect_resources(proc=proc, sys_fs_cgroup=tmp_path / "cg", affinity=lambda pid: {0})
    assert host.mem_available == 12 * GiB
    assert host.mem_total == 16 * GiB
    assert host.source == "cgroup memory limit"


def test_detect_resources_ignores_unlimited_cgroups(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, total_kb=8 * 1024**2, avail_kb=6 * 1024**2,
                      cgroup="4:memory:/job\n0::/job\n")
    v1 = tmp_path / "cg" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # v1's "unlimited"
    v2 = tmp_path / "cg" / "job"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    host = detect_resources(proc=proc, sys_fs_cgroup=tmp_path / "cg", affinity=lambda pid: {0, 1})
    assert host.mem_available == 6 * GiB
    assert host.mem_total == 8 * GiB


def test_detect_resources_cgroup_v1_limit(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, total_kb=8 * 1024**2, avail_kb=6 * 1024**2, cgroup="4:memory:/job\n")
    v1 = tmp_path / "cg" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(3 * GiB))
    (v1 / "memory.usage_in_bytes").write_text(str(1 * GiB))
    host = detect_resources(proc=proc, sys_fs_cgroup=tmp_path / "cg", affinity=lambda pid: {0, 1})
    assert host.mem_available == 2 * GiB


def test_detect_resources_on_this_machine_is_sane() -> None:
    host = detect_resources()
    assert host.cpus >= 1
    assert 0 < host.mem_available <= host.mem_total


def test_detect_glibc_reads_the_c_librarys_own_answer():
    from kforge.build.host import detect_glibc
    assert detect_glibc(lambda name: "glibc 2.36" if name == "CS_GNU_LIBC_VERSION" else None) == "2.36"
    assert detect_glibc(lambda name: None) is None  # musl answers nothing
    assert detect_glibc(lambda name: (_ for _ in ()).throw(ValueError(name))) is None  # no such name (macOS)
