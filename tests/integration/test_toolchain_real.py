"""The toolchain against the real thing: nvcc 13.0, ccache 4.x, torch in a real interpreter, PyPI.

``test_provision_cuda_13_from_pypi`` downloads about 120 MB from PyPI (nvcc, crt, nvvm,
runtime, cccl) and is marked ``slow``; deselect with ``-m "not slow"``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.build import toolchain
from kforge.errors import ToolchainError

pytestmark = pytest.mark.integration

CUDA = Path("/usr/local/cuda-13.0")
KERNEL = """#include "scale.h"
__global__ void axpy(float* y, const float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += SCALE * x[i]; }
void launch(float* y, const float* x, int n) { axpy<<<(n + 255) / 256, 256>>>(y, x, n); }
"""


def _need_nvcc() -> None:
    if not (CUDA / "bin" / "nvcc").is_file():
        pytest.skip(f"{CUDA}/bin/nvcc is not installed")


def test_find_real_nvcc() -> None:
    _need_nvcc()
    nvcc = toolchain.find_nvcc({"CUDA_HOME": str(CUDA), "PATH": "/usr/bin:/bin"}, cuda="13.0")
    assert nvcc.version >= Version("13.0") and nvcc.cuda == "13.0"
    assert {"compute_90", "compute_100", "compute_120"} <= nvcc.gpu_archs
    assert "compute_70" not in nvcc.gpu_archs  # CUDA 13 dropped Volta
    assert {"sm_90", "sm_120"} <= nvcc.gpu_codes
    with pytest.raises(ToolchainError, match="CUDA 12.4 is not installed"):
        toolchain.find_nvcc({"CUDA_HOME": str(CUDA), "PATH": ""}, cuda="12.4", fallback_dirs=())


def test_detect_torch_in_real_interpreters(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    assert toolchain.detect_torch(str(bare / "bin" / "python")) is None
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("no torch in the test interpreter")
    info = toolchain.detect_torch(sys.executable)
    assert info is not None and info.version.major >= 2
    assert str(info.version) in subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=False).stdout


# ---------------------------------------------------------------------------- ccache


def _stats(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split("\t") for line in out.splitlines() if "\t" in line) if v.isdigit()}


@pytest.fixture()
def ccache_env(tmp_path: Path) -> dict[str, str]:
    _need_nvcc()
    if not shutil.which("ccache"):
        pytest.skip("ccache is not installed (apt-get install ccache)")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CCACHE_DIR": str(tmp_path / "cache"),
           "CUDA_HOME": str(CUDA)}
    subprocess.run(["ccache", "-z"], env=env, capture_output=True, check=True)
    return env


def _torch_style(nvcc: str, src: Path, obj: Path) -> list[str]:
    """The flags torch's ninja rule passes (older torch spells -MD/-MF long)."""
    return [nvcc, "--generate-dependencies-with-compile", "--dependency-output", f"{obj}.d", "-c", str(src), "-o",
            str(obj), "-O0", "--threads", "2", "-gencode", "arch=compute_90,code=sm_90",
            "-gencode", "arch=compute_120,code=sm_120", "--compiler-options", "-fPIC"]


def test_nvcc_through_the_wrapper_is_cached(ccache_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "scale.h").write_text("#define SCALE 2.0f\n")
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    setup = toolchain.compiler_cache(ccache_env, wrapper_dir=tmp_path / "wrap", nvcc=CUDA / "bin" / "nvcc")
    assert setup is not None and setup.tool == "ccache" and setup.nvcc_wrapper is not None
    env = {**ccache_env, **setup.env}

    # without kforge's wrapper, ccache cannot cache torch's spelling at all
    # (ccache 4.7 files it as "multiple_source_files" or "preprocessor_error": never stored, never hit)
    plain = ["ccache", *_torch_style(str(CUDA / "bin" / "nvcc"), src, tmp_path / "plain.o")]
    for _ in range(2):
        subprocess.run(plain, env={**ccache_env, "CCACHE_DEPEND": "1"}, check=True, capture_output=True)
    s0 = _stats(ccache_env)
    assert s0.get("direct_cache_hit", 0) == 0 and s0.get("cache_miss", 0) == 0, s0
    subprocess.run(["ccache", "-z"], env=ccache_env, capture_output=True, check=True)

    first = subprocess.run(_torch_style(env["PYTORCH_NVCC"], src, tmp_path / "a.o"), env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    s1 = _stats(env)
    assert s1.get("cache_miss", 0) == 1 and s1.get("direct_cache_hit", 0) == 0
    obj1 = (tmp_path / "a.o").read_bytes()
    dep = (tmp_path / "a.o.d").read_text()
    assert "scale.h" in dep  # ninja still gets its depfile

    (tmp_path / "a.o").unlink()
    (tmp_path / "a.o.d").unlink()
    second = subprocess.run(_torch_style(env["PYTORCH_NVCC"], src, tmp_path / "a.o"), env=env, capture_output=True, text=True, check=False)
    assert second.returncode == 0, second.stderr
    s2 = _stats(env)
    assert s2.get("direct_cache_hit", 0) == 1, s2  # the warm compile is a hit
    assert (tmp_path / "a.o").read_bytes() == obj1
    assert "scale.h" in (tmp_path / "a.o.d").read_text()

    (tmp_path / "scale.h").write_text("#define SCALE 3.0f\n")  # a header change must miss
    third = subprocess.run(_torch_style(env["PYTORCH_NVCC"], src, tmp_path / "a.o"), env=env, capture_output=True, text=True, check=False)
    assert third.returncode == 0, third.stderr
    s3 = _stats(env)
    assert s3.get("cache_miss", 0) == 2 and s3.get("direct_cache_hit", 0) == 1
    assert (tmp_path / "a.o").read_bytes() != obj1


def test_cxx_wrapper_on_path_is_cached(ccache_env: dict[str, str], tmp_path: Path) -> None:
    setup = toolchain.compiler_cache(ccache_env, wrapper_dir=tmp_path / "wrap", nvcc=CUDA / "bin" / "nvcc")
    assert setup is not None
    env = {**ccache_env, **setup.env}
    assert shutil.which("c++", path=env["PATH"]) == str(tmp_path / "wrap" / "c++")
    (tmp_path / "x.cpp").write_text("int answer() { return 42; }\n")
    for _ in range(2):
        subprocess.run(["c++", "-MMD", "-MF", "x.o.d", "-c", "x.cpp", "-o", "x.o"], cwd=tmp_path, env=env, check=True)
    assert _stats(env).get("direct_cache_hit", 0) == 1


# ---------------------------------------------------------------------------- provisioning (slow)


@pytest.mark.slow
def test_provision_cuda_13_from_pypi(tmp_path: Path) -> None:
    if os.environ.get("KFORGE_SKIP_NETWORK") == "1":
        pytest.skip("KFORGE_SKIP_NETWORK=1")
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed as nvcc's host compiler")
    nvcc = toolchain.provision_cuda("13.0", tmp_path / "cache")
    assert nvcc.cuda == "13.0" and nvcc.path.is_relative_to(tmp_path)
    assert (nvcc.home / "lib64").is_symlink()
    assert "compute_90" in nvcc.gpu_archs
    (tmp_path / "scale.h").write_text("#define SCALE 2.0f\n")
    (tmp_path / "k.cu").write_text(KERNEL + "int main() { launch(nullptr, nullptr, 0); return 0; }\n")
    # compile and link an executable: needs crt headers, nvvm (cicc), cudart and the lib64 link
    out = subprocess.run([str(nvcc.path), "-O0", "-gencode", "arch=compute_90,code=sm_90", str(tmp_path / "k.cu"),
                          "-o", str(tmp_path / "k")], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "k").stat().st_size > 0
    again = toolchain.provision_cuda("13.0", tmp_path / "cache", runner=lambda argv, **kw: (
        pytest.fail("pip ran again") if "pip" in argv else subprocess.run(argv, capture_output=True, text=True, check=False)))
    assert again.path == nvcc.path
