"""ptxas_threads for real: ptxas ``--split-compile N`` through kforge's nvcc wrapper, with real nvcc.

* One unit of four kernels compiled to a cubin through the wrapper (``ptxas_threads = 3``) and by plain nvcc: every
  ELF section but ``.note.nv.tkinfo`` is byte-identical (the SASS, the symbols, the resource tables), and that
  note records ``-split-compile 3``, which the doctor's cubin reader returns.
* ``kforge build gencode-sm90 --ptxas-threads 3`` (the arch-enforcement fixture: one library built by nvcc from
  setup.py, one by CMake): the build log counts the split steps, every kernel of the published wheel records
  ``-split-compile 3``, the manifest's judgement carries it, and ``kforge doctor`` on the wheel passes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gencode import make_mono  # noqa: E402

from kforge.cuda.enforce import install, plan_enforcement  # noqa: E402
from kforge.doctor.resources import cubin_kernels, split_compile  # noqa: E402

pytestmark = pytest.mark.integration
SRC = Path(__file__).resolve().parents[2] / "src"
UNIT = "".join(f"__global__ void k{i}(float* x, int n) {{ for (int j = threadIdx.x; j < n; j += blockDim.x) "
               f"x[j] = x[j] * {i + 2}.0f + sinf(x[j]); }}\n" for i in range(4))


def _sections(cubin: Path) -> dict[str, bytes]:
    with cubin.open("rb") as fh:
        return {s.name: s.data() for s in ELFFile(fh).iter_sections()}


def test_split_ptxas_gives_the_same_sass_and_records_it(nvcc_env_and_host, tmp_path: Path) -> None:
    environ, host = nvcc_env_and_host
    nvcc = Path(host.nvcc_path)
    src = tmp_path / "unit.cu"
    src.write_text(UNIT)
    e = plan_enforcement("on", ["-gencode=arch=compute_90,code=sm_90"], 1, backend="native", platform_os="linux",
                         scripts_dir=None, ptxas_threads=3, ptxas_from="test")
    setup = install(e, nvcc=nvcc, cuda_home=nvcc.parent.parent, dest=tmp_path / "wrap", env=environ)
    env = {**environ, **setup.env}
    subprocess.run([str(setup.wrapper), "-cubin", str(src), "-o", str(tmp_path / "split.cubin")], env=env, check=True)
    subprocess.run([str(nvcc), "-cubin", "-gencode=arch=compute_90,code=sm_90", str(src), "-o",
                    str(tmp_path / "one.cubin")], env=environ, check=True)
    split, one = _sections(tmp_path / "split.cubin"), _sections(tmp_path / "one.cubin")
    assert split.keys() == one.keys() and sum(n.startswith(".text.") for n in split) == 4
    assert [n for n in split if split[n] != one[n]] == [".note.nv.tkinfo"]
    kernels = cubin_kernels((tmp_path / "split.cubin").read_bytes(), "sm_90", 9)
    assert len(kernels) == 4 and {split_compile(k.ptxas) for k in kernels} == {3}
    assert {split_compile(k.ptxas) for k in cubin_kernels((tmp_path / "one.cubin").read_bytes(), "sm_90", 9)} == {None}
    logged = [json.loads(line) for line in setup.log.read_text().splitlines()]
    assert [r["ptxas_threads"] for r in logged] == [3]


def test_a_build_with_ptxas_threads_records_them_and_passes_its_doctor(nvcc_env_and_host, tmp_path: Path) -> None:
    environ, _host = nvcc_env_and_host
    if not shutil.which("cmake", path=environ.get("PATH")):
        pytest.skip("cmake is not installed (apt-get install cmake): the fixture's second library is built by CMake")
    env = {**environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), environ.get("PYTHONPATH", "")) if p),
           "KFORGE_CACHE": str(tmp_path / "cache"), "KFORGE_COMPILER_CACHE": "none"}
    root = make_mono(tmp_path / "mono", mode="on")

    def kforge(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kforge.cli", *args], cwd=root, env=env, capture_output=True,
                              text=True, timeout=900)

    plan = kforge("plan", "gencode-sm90", "--ptxas-threads", "3")
    assert plan.returncode == 0, plan.stderr
    assert "\n  ptxas       --split-compile=3 in every device step" in plan.stdout
    out = kforge("build", "gencode-sm90", "--ptxas-threads", "3", "--wheelhouse", str(root / "wh"), "--no-progress")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "device step(s) got ptxas --split-compile=3 (the plan's ptxas_threads)" in out.stderr
    (wheel,) = (root / "wh" / "gencode").glob("*.whl")
    doctor = json.loads(Path(str(wheel) + ".manifest.json").read_text())["doctor"]
    assert doctor["judged_by"]["ptxas_threads"] == 3
    kernels = [k for b in doctor["binaries"] for k in b["kernels"]]
    assert kernels and {split_compile(k["ptxas"]) for k in kernels} == {3}
    alone = kforge("doctor", str(wheel), "--json")
    assert alone.returncode == 0, alone.stdout + alone.stderr
