"""kforge.build.run: OOM detection, and the one retry with half the jobs (in every thread variable)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kforge.build import run as buildrun
from kforge.build.jobs import JobChoice
from kforge.errors import BuildError


@pytest.mark.parametrize("rc,out,oom", [
    (137, "", True),
    (-9, "", True),
    (1, "nvcc error   : 'cicc' died due to signal 9 (Kill signal)", True),
    (1, "g++: fatal error: Killed signal terminated program cc1plus", True),
    (1, "nvcc error   : 'ptxas' died due to signal 11 (Invalid memory reference)", False),
    (1, "terminate called after throwing an instance of 'std::bad_alloc'", True),
    (1, "cc1plus: out of memory allocating 65536 bytes", True),
    (1, "virtual memory exhausted: Cannot allocate memory", True),
    (1, "error: identifier \"foo\" is undefined", False),
    (2, "ninja: build stopped: subcommand failed.", False),
])
def test_looks_oom(rc: int, out: str, oom: bool) -> None:
    assert buildrun.looks_oom(rc, out) is oom


def test_run_with_oom_retry_raises_build_error_for_plain_failures(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as err:
        buildrun.run_with_oom_retry([sys.executable, "-c", "print('syntax error here'); raise SystemExit(2)"],
                                {}, JobChoice(4, 1, "x"), log=lambda m: None)
    assert "exit code 2" in err.value.render().lower() and "syntax error here" in err.value.render()


def test_oom_retry_lowers_the_projects_own_thread_variable(tmp_path: Path) -> None:
    """After an OOM kill the retry halves the nvcc threads in *every* thread variable (flashinfer reads its own)."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "build.py"
    script.write_text(
        "import os, sys\n"
        f"with open({str(seen)!r}, 'a') as fh:\n"
        "    fh.write(os.environ['MAX_JOBS'] + ' ' + os.environ['NVCC_THREADS'] + ' '"
        " + os.environ['FLASHINFER_NVCC_THREADS'] + '\\n')\n"
        f"if len(open({str(seen)!r}).read().splitlines()) == 1:\n"
        "    print('nvcc error   : \\'cicc\\' died due to signal 9 (Kill signal)'); sys.exit(1)\n"
    )
    choice = JobChoice(1, 4, "test", thread_vars=("NVCC_THREADS", "FLASHINFER_NVCC_THREADS"))
    run = buildrun.run_with_oom_retry([sys.executable, str(script)], {"FLASHINFER_NVCC_THREADS": "4"}, choice,
                                      log=lambda m: None)
    assert run.retried and run.attempts[0].oom
    assert seen.read_text().splitlines() == ["1 4 4", "1 2 2"]  # one job: the threads were halved, in both names
