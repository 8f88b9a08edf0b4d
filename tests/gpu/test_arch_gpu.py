"""kforge.cuda.arch on a real GPU: the flags it renders for the host's arch give a kernel that runs.

And the failure users keep reporting ("no kernel image is available for execution on the
device") shows up exactly when the rendered flags leave the GPU's arch out. Skips without a
GPU; fails instead when ``KFORGE_REQUIRE_GPU=1``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from kforge.cuda.arch import Arch, host_arch, parse_arch, supported_archs
from kforge.cuda.render import default_variant, render_gencode

pytestmark = pytest.mark.gpu

PROGRAM = r"""
#include <cstdio>
__global__ void add_one(int* x) { x[threadIdx.x] += 1; }
int main() {
  int h[32], *d = nullptr;
  for (int i = 0; i < 32; ++i) h[i] = i;
  if (cudaMalloc(&d, sizeof h) != cudaSuccess) { std::printf("malloc failed\n"); return 2; }
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  add_one<<<1, 32>>>(d);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { std::printf("launch: %s\n", cudaGetErrorString(e)); return 3; }
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 32; ++i) if (h[i] != i + 1) { std::printf("wrong result at %d\n", i); return 4; }
  std::printf("ok\n");
  return 0;
}
"""


def _no_gpu(reason: str):
    if os.environ.get("KFORGE_REQUIRE_GPU") == "1":
        pytest.fail(f"KFORGE_REQUIRE_GPU=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def device() -> tuple[Arch, str, Version]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        _no_gpu("no nvidia-smi on PATH")
    proc = subprocess.run([smi, "--query-gpu=compute_cap,name", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        _no_gpu(f"nvidia-smi found no GPU: {proc.stderr.strip() or proc.stdout.strip()}")
    cap, _name = (s.strip() for s in proc.stdout.splitlines()[0].split(",", 1))
    major, minor = (int(x) for x in cap.split("."))
    nvcc = os.environ.get("KFORGE_NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).is_file():
        pytest.fail("a GPU but no nvcc (set KFORGE_NVCC)")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    cuda = Version(re.search(r"release (\d+\.\d+)", version)[1])
    return host_arch((major, minor)), nvcc, cuda


def _build_and_run(nvcc: str, tmp_path: Path, flags: tuple[str, ...]) -> subprocess.CompletedProcess:
    src = tmp_path / "add_one.cu"
    src.write_text(PROGRAM)
    exe = tmp_path / "add_one"
    subprocess.run([nvcc, "-O0", *flags, str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False)


def test_host_arch_flags_run(device, tmp_path):
    arch, nvcc, _cuda = device
    run = _build_and_run(nvcc, tmp_path, render_gencode([arch], ptx=False))
    assert (run.returncode, run.stdout.strip()) == (0, "ok"), run.stdout


def test_default_variant_flags_run(device, tmp_path):
    arch, nvcc, cuda = device
    chosen = default_variant(arch, cuda)
    run = _build_and_run(nvcc, tmp_path, render_gencode([chosen], ptx=False))
    assert (run.returncode, run.stdout.strip()) == (0, "ok"), (chosen, run.stdout)


def test_older_sass_alone_gives_no_kernel_image_and_ptx_fixes_it(device, tmp_path):
    arch, nvcc, cuda = device
    older = [a for a in supported_archs(cuda) if a.major < arch.major]
    if not older:
        pytest.skip(f"no older major arch than {arch} in CUDA {cuda}")
    old = older[-1]
    run = _build_and_run(nvcc, tmp_path, render_gencode([old], ptx=False))
    assert run.returncode == 3 and "no kernel image" in run.stdout, (old, run.stdout)
    run = _build_and_run(nvcc, tmp_path, render_gencode([parse_arch(f"{old.suffixed}+PTX")], ptx=False))
    assert (run.returncode, run.stdout.strip()) == (0, "ok"), (old, run.stdout)
