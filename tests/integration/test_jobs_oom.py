"""A real out-of-memory compile, and kforge's one retry with half the jobs.

The "machine" is a memory budget shared by the parallel compile units: each nvcc runs
under ``prlimit --as=BUDGET/MAX_JOBS`` (ninja's ``-j`` and the budget split both follow
MAX_JOBS). With two jobs the real nvcc front end runs out of memory ("catastrophic error:
out of memory"); with one job it has the whole budget and compiles. The budget is derived
from this machine's real threshold, found by bisection, so the test holds on any host.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kforge.build import jobs, measure
from kforge.build import run as buildrun
from kforge.errors import BuildError

pytestmark = pytest.mark.integration

NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")
MiB = 1024 * 1024

KERNEL = """
#include <cstdio>
template <int N> struct Step { static __device__ float apply(float x) { return Step<N - 1>::apply(x) * 1.0001f + N; } };
template <> struct Step<0> { static __device__ float apply(float x) { return x; } };
__global__ void k(float* a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] = Step<UNIT>::apply(a[i]); }
void launch(float* a, int n) { k<<<(n + 127) / 128, 128>>>(a, n); }
"""


def _nvcc() -> Path:
    if not NVCC.is_file():
        pytest.skip(f"{NVCC} is not installed")
    if not shutil.which("prlimit") or not shutil.which("ninja"):
        pytest.skip("prlimit and ninja are needed")
    return NVCC


def _compile_under(limit: int, src: Path, out: Path) -> bool:
    argv = ["prlimit", f"--as={limit}", str(NVCC), "-O0", "-gencode", "arch=compute_90,code=sm_90", "-DUNIT=8",
            "-c", str(src), "-o", str(out)]
    return subprocess.run(argv, capture_output=True, text=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def oom_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Two .cu units, a build.ninja that splits BUDGET over MAX_JOBS, and a budget that fits one job only."""
    _nvcc()
    d = tmp_path_factory.mktemp("oom")
    for name in ("a", "b"):
        (d / f"{name}.cu").write_text(KERNEL)
    lo, hi = 32 * MiB, 2048 * MiB  # lo fails, hi works
    if not _compile_under(hi, d / "a.cu", d / "probe.o"):
        pytest.skip("nvcc does not compile even with 2 GiB of address space here")
    while hi - lo > 8 * MiB:
        mid = (lo + hi) // 2
        if _compile_under(mid, d / "a.cu", d / "probe.o"):
            hi = mid
        else:
            lo = mid
    threshold = hi
    budget = int(threshold * 1.6)  # one job: 1.6x what it needs; two jobs: 0.8x each
    (d / "build.ninja").write_text(
        f"rule nvcc\n"
        f"  command = prlimit --as=$$(( {budget} / $${{MAX_JOBS:-1}} )) {NVCC} -O0 "
        f"-gencode arch=compute_90,code=sm_90 -DUNIT=8 -c $in -o $out\n"
        f"build a.o: nvcc a.cu\nbuild b.o: nvcc b.cu\n"
    )
    return d, budget


def _ninja(d: Path):
    return lambda choice: ["ninja", "-C", str(d), "-j", str(choice.max_jobs)]


def test_oom_is_retried_once_with_half_the_jobs(oom_project: tuple[Path, int]) -> None:
    d, _ = oom_project
    for f in ("a.o", "b.o", ".ninja_log"):
        (d / f).unlink(missing_ok=True)
    said: list[str] = []
    lines: list[str] = []
    run = buildrun.run_with_oom_retry(_ninja(d), {"PATH": "/usr/bin:/bin"}, jobs.JobChoice(2, 1, "test"),
                                  log=said.append, echo=lines.append)
    assert run.retried
    first, second = run.attempts
    assert first.oom and first.returncode != 0 and first.choice.max_jobs == 2
    assert second.returncode == 0 and second.choice.max_jobs == 1 and not second.oom
    assert any("out of memory" in line for line in lines), "nvcc itself must have reported the OOM"
    assert len(said) == 1 and "retrying once with 1 jobs" in said[0]
    assert (d / "a.o").stat().st_size > 0 and (d / "b.o").stat().st_size > 0


def test_oom_twice_fails_with_the_story(oom_project: tuple[Path, int]) -> None:
    d, budget = oom_project
    tight = d / "tight"
    tight.mkdir(exist_ok=True)
    for name in ("a", "b"):
        shutil.copy(d / f"{name}.cu", tight / f"{name}.cu")
    # a budget that even one job cannot compile in
    (tight / "build.ninja").write_text((d / "build.ninja").read_text().replace(f"{budget} /", f"{budget // 2} /"))
    said: list[str] = []
    with pytest.raises(BuildError) as err:
        buildrun.run_with_oom_retry(_ninja(tight), {"PATH": "/usr/bin:/bin"}, jobs.JobChoice(2, 1, "test"),
                                log=said.append)
    text = err.value.render()
    assert "out-of-memory" in text and "retried once with 1 jobs" in text
    assert len(said) == 1


def test_measure_wrapper_on_a_real_nvcc_compile(oom_project: tuple[Path, int], tmp_path: Path) -> None:
    d, _ = oom_project
    log = tmp_path / "units.jsonl"
    rc = measure.main(["measure", "--log", str(log), "--output", "m.o", "--", str(NVCC), "-O0", "-gencode",
                     "arch=compute_90,code=sm_90", "-DUNIT=8", "-c", str(d / "a.cu"), "-o", str(tmp_path / "m.o")])
    assert rc == 0
    (m,) = measure.read_measures(log)
    assert m.output == "m.o" and m.returncode == 0
    assert 20 * MiB < m.peak_rss < 4096 * MiB  # cicc/cudafe++ really ran
    assert m.seconds > 0.1
