"""Run a build command with a job choice, and retry it once with half the jobs after an out-of-memory kill.

:func:`run_with_oom_retry` puts a :class:`~kforge.build.jobs.JobChoice`'s knobs (``MAX_JOBS``, every
thread variable of the plan, ``CMAKE_BUILD_PARALLEL_LEVEL``) into the command's environment, and
on an OOM kill runs it once more with :meth:`~kforge.build.jobs.JobChoice.halved`. Measuring compile
units is :mod:`kforge.build.measure`'s job.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from kforge.build.jobs import JobChoice
from kforge.errors import BuildError

#: Output that means a compile unit ran out of memory (rather than failed to compile).
OOM_PATTERNS = (
    re.compile(r"\bKilled\b"),
    re.compile(r"out of memory", re.IGNORECASE),
    re.compile(r"std::bad_alloc"),
    re.compile(r"Cannot allocate memory"),
    re.compile(r"virtual memory exhausted"),
    re.compile(r"terminated by signal 9"),
    re.compile(r"died due to signal 9"),  # nvcc: 'cicc' died due to signal 9 (Kill signal)
    re.compile(r"signal: killed|killed by signal 9|SIGKILL", re.IGNORECASE),
    re.compile(r"Insufficient memory", re.IGNORECASE),
    re.compile(r"failed to map segment from shared object"),  # mmap ENOMEM while loading a tool
)


def looks_oom(returncode: int, output: str) -> bool:
    if returncode in (137, -9):
        return True
    return any(p.search(output) for p in OOM_PATTERNS)


@dataclass(frozen=True)
class Attempt:
    choice: JobChoice
    returncode: int
    seconds: float
    oom: bool


@dataclass(frozen=True)
class BuildRun:
    attempts: tuple[Attempt, ...]
    output_tail: str

    @property
    def retried(self) -> bool:
        return len(self.attempts) > 1

    @property
    def choice(self) -> JobChoice:
        return self.attempts[-1].choice


Command: TypeAlias = "Sequence[str] | Callable[[JobChoice], Sequence[str]]"


def run_with_oom_retry(
    cmd: Command,
    env: Mapping[str, str],
    choice: JobChoice,
    *,
    cwd: Path | None = None,
    log: Callable[[str], None] = lambda msg: print(f"kforge: {msg}", file=sys.stderr),
    echo: Callable[[str], None] | None = None,
    tail_chars: int = 4000,
) -> BuildRun:
    """Run a build with ``choice``'s knobs in its environment; on an OOM kill, retry once with half.

    ``cmd`` may be a function of the choice (to put ``-j N`` on the command line). Lines of
    output go to ``echo`` as they arrive. A build that fails for another reason, or OOMs
    twice, raises :class:`BuildError` with the command, exit code and the tail of its output.
    """
    attempts: list[Attempt] = []
    current = choice
    while True:
        argv = list(cmd(current) if callable(cmd) else cmd)
        full_env = {**env, **current.env()}
        start = time.monotonic()
        rc, output = _run_capture(argv, full_env, cwd, echo)
        oom = rc != 0 and looks_oom(rc, output)
        attempts.append(Attempt(current, rc, time.monotonic() - start, oom))
        tail = output[-tail_chars:]
        if rc == 0:
            return BuildRun(tuple(attempts), tail)
        smaller = current.halved() if oom and len(attempts) == 1 else None
        if smaller is None:
            why = f"exit code {rc}" + (" after an out-of-memory kill" if oom else "")
            if oom and len(attempts) > 1:
                why += f" (retried once with {current.max_jobs} jobs x {current.nvcc_threads} nvcc threads)"
            raise BuildError(
                f"the build command failed: {' '.join(argv)}",
                why=f"{why}; last output:\n{tail}",
                fix=("free memory or set MAX_JOBS lower" if oom else "read the compiler output above"),
            )
        log(f"a compile unit ran out of memory with {current.max_jobs} jobs x {current.nvcc_threads} "
            f"nvcc threads; retrying once with {smaller.max_jobs} jobs x {smaller.nvcc_threads} threads")
        current = smaller


def _run_capture(argv, env, cwd, echo) -> tuple[int, str]:
    try:
        proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as exc:
        raise BuildError(f"cannot start {argv[0]}", why=str(exc), fix="check that the build tool is installed") from exc
    chunks: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        chunks.append(line)
        if echo:
            echo(line.rstrip("\n"))
    return proc.wait(), "".join(chunks)
