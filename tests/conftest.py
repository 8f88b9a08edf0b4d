"""Shared test setup: the GPU rule (skip without a GPU, fail instead when KFORGE_REQUIRE_GPU=1)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
