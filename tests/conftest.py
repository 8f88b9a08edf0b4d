"""Shared test setup: the GPU rule (skip without a GPU, fail instead when KFORGE_REQUIRE_GPU=1)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))  # kforge_gitfixtures, kforge_doctor_builders


@functools.cache
def gpu_name() -> str | None:
    """The first GPU as nvidia-smi names it, or None. No torch needed."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out.strip() else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None or gpu_name():
        return
    if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
        pytest.fail("KFORGE_REQUIRE_GPU=1 but this machine has no NVIDIA GPU (nvidia-smi found none)", pytrace=False)
    pytest.skip("no NVIDIA GPU on this machine (nvidia-smi found none); KFORGE_REQUIRE_GPU=1 makes this a failure")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def nvcc() -> str:
    """The nvcc the real-build tests compile with (CUDA_HOME, PATH or /usr/local/cuda*)."""
    import kforge_doctor_builders

    found = kforge_doctor_builders.find_nvcc()
    if not found:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return found


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the doctor/repair fixtures' real builds, shared by the whole session (they are cached)."""
    return tmp_path_factory.getbasetemp() / "kforge-doctor-fixtures"


@pytest.fixture(scope="session")
def nvcc_env_and_host():
    """The environment and host facts a real build sees; skips where no nvcc is found."""
    from kforge.host import detect_host

    environ = dict(os.environ)
    if not environ.get("CUDA_HOME") and Path("/usr/local/cuda-13.0/bin/nvcc").is_file():
        environ["CUDA_HOME"] = "/usr/local/cuda-13.0"
    host = detect_host(environ, probe_torch=False)
    if host.nvcc_path is None:
        pytest.skip("no nvcc found (set CUDA_HOME): these tests compile real CUDA")
    return environ, host
