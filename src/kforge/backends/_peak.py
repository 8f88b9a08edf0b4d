"""Process wrappers the backends put in front of build commands (run as ``python -m``).

``python -m kforge.backends._peak run OUT.json -- CMD...``
    Run CMD (output passes straight through) and write the peak RSS of its largest single
    process to OUT.json. On Linux ``wait4`` reports ``ru_maxrss`` of the child and of every
    descendant it reaped, so a compiler deep under pip/ninja/nvcc is counted. The exit code
    is CMD's; a signal ``N`` becomes ``128 + N`` (137 for the OOM killer's SIGKILL).

``python -m kforge.backends._peak unit LOG -- CMD...``
    A compile launcher (``PYTORCH_NVCC``, ``CMAKE_<LANG>_COMPILER_LAUNCHER``): measure one
    compile unit (time; peak RSS as the larger of ``wait4``'s ``ru_maxrss`` and the sampled
    sum over the process tree, as :func:`kforge.jobs.measure_command` does) and append it to
    LOG as a :class:`kforge.jobs.UnitMeasure` line that :func:`kforge.jobs.read_measures`
    reads. The unit is named by the argument after ``-o`` (the object ninja names in
    ``.ninja_log``). Commands that do not compile (``-c``, ``-dc``, ...), such as links, run
    unmeasured. A unit in which no compiler worker (cicc, ptxas, cc1plus, ...) was seen is
    not recorded: it was served from a compiler cache (ccache, sccache), and its few MB and
    milliseconds say nothing about what compiling it costs (it would mislead the job choice).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from kforge.buildrun import process_tree
from kforge.jobs import UnitMeasure


def output_of(cmd: Sequence[str]) -> str:
    """The object a compile command writes: the argument after ``-o`` (or ``--output-file``)."""
    for i, arg in enumerate(cmd):
        if arg in ("-o", "--output-file") and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith("--output-file="):
            return arg.partition("=")[2]
    return cmd[-1] if cmd else ""


def _exit_code(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc


def run(out: str, cmd: Sequence[str]) -> int:
    try:
        proc = subprocess.Popen(list(cmd))
    except OSError as exc:
        print(f"kforge: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127
    peak = 0
    if hasattr(os, "wait4"):
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    else:  # pragma: no cover - Windows has no wait4; the peak stays unmeasured (0)
        proc.wait()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"peak_rss": peak, "returncode": proc.returncode}, fh)
    return _exit_code(proc.returncode)


#: Processes that do a compile's real work. A compiler cache's hit runs none of them.
WORKERS = frozenset({"cicc", "ptxas", "cudafe++", "nvlink", "fatbinary", "cc1", "cc1plus", "clang", "clang++",
                     "clang-18", "clang-19", "clang-20", "cl.exe", "as"})

#: Flags that make a command a compile (gcc/clang/nvcc); anything else (a link) runs unmeasured.
COMPILE_FLAGS = frozenset({"-c", "--compile", "-dc", "--device-c", "-dw", "--device-w"})


def measure(cmd: Sequence[str], *, output: str, nvcc_threads: int) -> tuple[UnitMeasure, set[str] | None]:
    """Run one compile; its measure, and the names of the processes seen (None without /proc)."""
    start = time.monotonic()
    proc = subprocess.Popen(list(cmd))
    has_proc = os.path.isdir("/proc")
    page = os.sysconf("SC_PAGE_SIZE") if has_proc else 0
    peak_sum, interval = 0, 0.02
    seen: set[str] = set()
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if has_proc:
            total, names = process_tree(proc.pid, page)
            peak_sum, seen = max(peak_sum, total), seen | names
        time.sleep(interval)
        interval = min(0.2, interval * 1.5)  # fine early, so a short real compile is still seen
    rc = os.waitstatus_to_exitcode(status)
    peak = max(peak_sum, usage.ru_maxrss * 1024)
    return (UnitMeasure(output=output, seconds=time.monotonic() - start, peak_rss=peak, returncode=rc,
                        nvcc_threads=nvcc_threads), seen if has_proc else None)


def unit(log: str, cmd: Sequence[str]) -> int:
    if not COMPILE_FLAGS.intersection(cmd):  # links are not compile units: run them as they are
        try:
            return _exit_code(subprocess.run(list(cmd)).returncode)
        except OSError as exc:
            print(f"kforge: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
            return 127

    threads = 1
    for i, arg in enumerate(cmd):
        if arg in ("--threads", "-t") and i + 1 < len(cmd) and cmd[i + 1].isdigit():
            threads = int(cmd[i + 1])
        elif arg.startswith("--threads=") and arg[10:].isdigit():
            threads = int(arg[10:])
    try:
        m, names = measure(cmd, output=output_of(cmd), nvcc_threads=threads)
    except OSError as exc:
        print(f"kforge: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127
    if names is not None and not (names & WORKERS):  # a compiler-cache hit: nothing was compiled
        return _exit_code(m.returncode)
    line = (json.dumps(asdict(m)) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one O_APPEND write: parallel jobs don't interleave
    finally:
        os.close(fd)
    return _exit_code(m.returncode)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if len(args) < 4 or args[0] not in ("run", "unit") or args[2] != "--":
        print("usage: python -m kforge.backends._peak {run OUT.json | unit LOG} -- CMD...", file=sys.stderr)
        return 2
    return run(args[1], args[3:]) if args[0] == "run" else unit(args[1], args[3:])


if __name__ == "__main__":  # pragma: no cover - exercised through subprocesses in tests
    sys.exit(main(sys.argv[1:]))
