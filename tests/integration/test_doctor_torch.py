"""The fatbin parser against cuobjdump on a large real-world build: the installed torch's CUDA libraries.

Skips where torch (with CUDA) or cuobjdump is missing; on the GPU host both are there.
"""

from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path

import pytest

from kforge.doctor import inspect_binary

pytestmark = [pytest.mark.integration, pytest.mark.slow]


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_doctor_builders as B  # noqa: E402


def _torch_cuda_libs() -> list[Path]:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return [p for p in (lib / "libtorch_cuda.so", lib / "libc10_cuda.so") if p.is_file()]


# libtorch_cuda.so carries thousands of kernels; libc10_cuda.so carries none (both tools must agree on that too).
@pytest.mark.parametrize(("name", "has_device_code"), [("libtorch_cuda.so", True), ("libc10_cuda.so", False)])
def test_parser_agrees_with_cuobjdump_on_torch(name: str, has_device_code: bool) -> None:
    libs = {p.name: p for p in _torch_cuda_libs()}
    if name not in libs:
        pytest.skip(f"torch with CUDA is not installed here ({name} not found)")
    cuobjdump = B.find_cuobjdump()
    if not cuobjdump:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    theirs = collections.Counter(B.cuobjdump_list(cuobjdump, libs[name]))
    report = inspect_binary(libs[name])
    ours = collections.Counter(
        f"{e.kind} sm_{e.major}{e.minor}" + ("a" if e.variant == "a" else "") for e in report.fatbins if e.kind in ("sass", "ptx")
    )
    assert bool(theirs) is has_device_code, f"cuobjdump listed {sum(theirs.values())} entries in {libs[name]}"
    assert ours == theirs
    print(f"{name}: {sum(ours.values())} entries, SASS {report.sass_archs}, PTX {report.ptx_archs}")
