"""pytest setup for kforge_fmha's tests.

Registers the ``gpu`` marker. A gpu test is skipped (with the reason) when there is no usable
CUDA GPU, and FAILS instead when KFORGE_REQUIRE_GPU=1, so a GPU runner cannot pass by skipping.
The tests import the INSTALLED kforge_fmha (pip install ./kernels/fmha first).
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpu: needs an NVIDIA GPU (skips without one; fails instead when KFORGE_REQUIRE_GPU=1)",
    )


def _gpu_problem() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA GPU visible to torch {torch.__version__}"
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        return f"GPU {torch.cuda.get_device_name()} is older than sm_80"
    return None


_PROBLEM: list[str | None] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    if not _PROBLEM:
        _PROBLEM.append(_gpu_problem())
    problem = _PROBLEM[0]
    if problem is None:
        return
    if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
        pytest.fail(f"KFORGE_REQUIRE_GPU=1 but GPU tests cannot run: {problem}", pytrace=False)
    pytest.skip(f"GPU test skipped: {problem}")
