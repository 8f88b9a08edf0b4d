"""Running a build: the one retry after an out-of-memory kill, and measuring each compile unit.

:func:`run_with_oom_retry` runs a build command with a :class:`~kforge.jobs.JobChoice`'s knobs
and retries once with half the jobs when a unit was OOM-killed. :func:`measure_command` (and
its command-line form ``python -m kforge.jobs measure``) wraps one compile and records its
time and peak RSS, which :func:`kforge.jobs.record` folds into the project's profile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from kforge.errors import BuildError

if TYPE_CHECKING:
    from kforge.jobs import JobChoice


@dataclass(frozen=True)
class UnitMeasure:
    """One compile unit as measured by :func:`measure_command` (or taken from a report)."""

    output: str
    seconds: float
    peak_rss: int  # bytes
    returncode: int = 0
    nvcc_threads: int = 1


# ---------------------------------------------------------------------------- running a build

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


# ---------------------------------------------------------------------------- measuring one unit


def process_tree(root_pid: int, page: int | None = None) -> tuple[int, set[str]]:
    """RSS summed over ``root_pid`` and its descendants, and their process names, from /proc."""
    page = page or os.sysconf("SC_PAGE_SIZE")
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        left, right = stat.find("("), stat.rfind(")")
        fields = stat[right + 2:].split()
        pid = int(entry.name)
        names[pid] = stat[left + 1:right]
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * page
    total, seen, todo = 0, set(), [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        seen.add(names.get(pid, ""))
        todo.extend(children.get(pid, ()))
    return total, seen


def _tree_rss(root_pid: int) -> int:
    """Sum of RSS over ``root_pid`` and its descendants (0 where unreadable)."""
    return process_tree(root_pid)[0]


def measure_command(argv: Sequence[str], *, output: str = "", interval: float = 0.2,
                    nvcc_threads: int = 1) -> UnitMeasure:
    """Run one compile command; return its time and peak RSS.

    The peak is the larger of wait4's ``ru_maxrss`` (the largest single process in the tree,
    exact) and the sampled sum over the process tree (catches nvcc's concurrent threads).
    """
    start = time.monotonic()
    proc = subprocess.Popen(list(argv))
    peak_sum = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak_sum = max(peak_sum, _tree_rss(proc.pid))
        time.sleep(interval)
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak = max(peak_sum, usage.ru_maxrss * 1024)
    return UnitMeasure(output=output, seconds=time.monotonic() - start, peak_rss=peak,
                       returncode=proc.returncode, nvcc_threads=nvcc_threads)


def read_measures(path: Path) -> tuple[UnitMeasure, ...]:
    """Units appended by ``python -m kforge.jobs measure --log PATH`` (last one per output wins)."""
    found: dict[str, UnitMeasure] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ()
    for line in lines:
        try:
            found[json.loads(line)["output"]] = UnitMeasure(**json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue
    return tuple(found.values())


def _main(argv: Iterable[str]) -> int:
    """``python -m kforge.jobs measure --log FILE [--output NAME] [--threads N] -- CMD...``: a compile wrapper."""
    args = list(argv)
    if not args or args[0] != "measure" or "--" not in args:
        print("usage: python -m kforge.jobs measure --log FILE [--output NAME] [--threads N] -- CMD...", file=sys.stderr)
        return 2
    sep = args.index("--")
    opts, cmd = args[1:sep], args[sep + 1:]
    kv = dict(zip(opts[::2], opts[1::2], strict=False))
    m = measure_command(cmd, output=kv.get("--output", cmd[-1] if cmd else ""),
                        nvcc_threads=int(kv.get("--threads", "1")))
    if "--log" in kv:
        line = json.dumps(asdict(m)) + "\n"
        fd = os.open(kv["--log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: concurrent jobs don't interleave
        finally:
            os.close(fd)
    return m.returncode if m.returncode >= 0 else 128 - m.returncode
