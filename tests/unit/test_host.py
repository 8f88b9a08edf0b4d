"""Host facts: the GPU as nvidia-smi reports it (a fake nvidia-smi script stands in for the driver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.host import detect_gpu, platform_name


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
