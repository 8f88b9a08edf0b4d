"""The doctor's verdict against what a real GPU does with the binary.

For builds with different arch sets, kforge's doctor says whether the GPU in this machine
has a kernel image; then the kernel is launched there. "error" must mean the launch fails
with cudaErrorNoKernelImageForDevice (209) and anything else must mean it runs correctly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.doctor import check, inspect_binary

pytestmark = pytest.mark.gpu

NO_KERNEL_IMAGE = 209


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_doctor_builders as B  # noqa: E402


def _no_gpu(reason: str) -> None:
    if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
        pytest.fail(f"KFORGE_REQUIRE_GPU=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def capability() -> tuple[int, int]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        _no_gpu("no GPU: nvidia-smi not found")
    proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        _no_gpu(f"no GPU: nvidia-smi failed ({proc.stdout.strip() or proc.stderr.strip()})")
    major, minor = proc.stdout.splitlines()[0].strip().split(".")
    return int(major), int(minor)


def _cases(cap: tuple[int, int]) -> dict[str, list[str]]:
    """Arch sets relative to the device: one that matches, PTX the driver can JIT, and two without an image."""
    major, minor = cap
    own = f"{major}{minor}" + ("a" if major >= 9 else "")
    other_major = ["80", "86"] if major != 8 else ["90"]
    foreign_ptx = "120a" if (major, minor) != (12, 0) else "100a"
    return {
        "exact": [f"arch=compute_{own},code=sm_{own}"],
        "ptx-jit": ["arch=compute_75,code=compute_75"],
        "other-major": [f"arch=compute_{a},code=sm_{a}" for a in other_major],
        "foreign-arch-specific-ptx": [f"arch=compute_{foreign_ptx},code=compute_{foreign_ptx}"],
    }


@pytest.mark.parametrize("case", ["exact", "ptx-jit", "other-major", "foreign-arch-specific-ptx"])
def test_doctor_verdict_matches_the_gpu(case: str, capability: tuple[int, int], nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    gencodes = [(g, "") for g in _cases(capability)[case]]
    work = tmp_path_factory.getbasetemp() / "kforge-doctor-gpu"
    lib = B.nvcc_shared(nvcc, work / f"lib-{case}.so", gencodes)
    device_arch = f"sm_{capability[0]}{capability[1]}"
    findings = check(inspect_binary(lib), expect_archs=[device_arch])
    predicted_failure = any(f.is_error for f in findings)
    # Each case in its own process: a CUDA context that saw one library says nothing about the next.
    code = subprocess.run(
        [sys.executable, "-c", f"import ctypes,sys; sys.exit(ctypes.CDLL({str(lib)!r}).kf_probe() & 255)"],
        capture_output=True, text=True, check=False,
    ).returncode  # fmt: skip
    if predicted_failure:
        assert code == NO_KERNEL_IMAGE, f"{case}: doctor said no image for {device_arch} ({findings}), the GPU returned {code}"
    else:
        assert code == 0, f"{case}: doctor said it runs on {device_arch} ({findings}), the GPU returned {code}"
    expected_failure = case in ("other-major", "foreign-arch-specific-ptx")
    assert predicted_failure is expected_failure, findings
