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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    problem = _gpu_problem()
    if problem is None:
        return
    if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
        for item in gpu_items:
            item.add_marker(pytest.mark.usefixtures("_require_gpu_failure"))
        config._kforge_gpu_problem = problem  # type: ignore[attr-defined]
        return
    skip = pytest.mark.skip(reason=f"GPU test skipped: {problem}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def _require_gpu_failure(request: pytest.FixtureRequest) -> None:
    problem = getattr(request.config, "_kforge_gpu_problem", "no GPU")
    pytest.fail(f"KFORGE_REQUIRE_GPU=1 but GPU tests cannot run: {problem}", pytrace=False)
