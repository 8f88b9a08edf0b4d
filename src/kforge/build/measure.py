"""Measure commands: the time and peak RSS of a build command or one compile unit (the wrapper builds run under).

One measuring routine, three command-line forms (``python -m kforge.build.measure ...``):

``run OUT.json -- CMD...``
    Run CMD (output passes straight through) and write the peak RSS of its largest single
    process to OUT.json. On Linux ``wait4`` reports ``ru_maxrss`` of the child and of every
    descendant it reaped, so a compiler deep under pip/ninja/nvcc is counted. The exit code
    is CMD's; a signal ``N`` becomes ``128 + N`` (137 for the OOM killer's SIGKILL).

``unit LOG -- CMD...``
    A compile launcher (``PYTORCH_NVCC``, ``CMAKE_<LANG>_COMPILER_LAUNCHER``): measure one
    compile unit (time; peak RSS as the larger of ``wait4``'s ``ru_maxrss`` and the sampled
    sum over the process tree) and append it to LOG as a :class:`UnitMeasure` line that
    :func:`read_measures` reads. The unit is named by the argument after ``-o`` (the object
    ninja names in ``.ninja_log``). Commands that do not compile (``-c``, ``-dc``, ...), such as
    links, run unmeasured. A unit in which no compiler worker (cicc, ptxas, cc1plus, ...) was
    seen is not recorded: it was served from a compiler cache (ccache, sccache), and its few MB
    and milliseconds say nothing about what compiling it costs (it would mislead the job choice).

``measure --log LOG [--output NAME] [--threads N] -- CMD...``
    Measure any command as one unit and always record it (a ninja rule that names its own output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class UnitMeasure:
    """One compile unit as measured here (or taken from a report)."""

    output: str
    seconds: float
    peak_rss: int  # bytes
    returncode: int = 0
    nvcc_threads: int = 1


#: Processes that do a compile's real work. A compiler cache's hit runs none of them.
WORKERS = frozenset({"cicc", "ptxas", "cudafe++", "nvlink", "fatbinary", "cc1", "cc1plus", "clang", "clang++",
                     "clang-18", "clang-19", "clang-20", "cl.exe", "as"})

#: Flags that make a command a compile (gcc/clang/nvcc); anything else (a link) runs unmeasured.
COMPILE_FLAGS = frozenset({"-c", "--compile", "-dc", "--device-c", "-dw", "--device-w"})

USAGE = ("usage: python -m kforge.build.measure {run OUT.json | unit LOG | measure --log LOG [--output NAME] "
         "[--threads N]} -- CMD...")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(name, parent pid, resident pages) of one process from ``/proc/<pid>/stat``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    left, right = stat.find("("), stat.rfind(")")
    fields = stat[right + 2:].split()
    return stat[left + 1:right], int(fields[1]), int(fields[21])


def _children(pid: int) -> list[int] | None:
    """The children of every thread of ``pid`` (``/proc/<pid>/task/<tid>/children``); None where the
    kernel has no such file (built without CONFIG_PROC_CHILDREN)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # the process is gone
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return kids


def process_tree(root_pid: int, page: int | None = None) -> tuple[int, set[str]]:
    """RSS summed over ``root_pid`` and its descendants, and their process names, from /proc.

    It walks the tree down from ``root_pid`` through each thread's ``children`` file, reading the
    few processes of one compile, not every process on the host: sixteen parallel units, each
    sampled five times a second, would otherwise read all of /proc eighty times a second. Without
    ``children`` files it reads every ``/proc/<pid>/stat`` and links parents to children itself.
    """
    page = page or os.sysconf("SC_PAGE_SIZE")
    total, seen, todo = 0, set(), [root_pid]
    while todo:
        pid = todo.pop()
        st = _stat(pid)
        if st is not None:
            seen.add(st[0])
            total += st[2] * page
        kids = _children(pid)
        if kids is None:
            return _process_tree_by_scan(root_pid, page)
        todo.extend(kids)
    return total, seen


def _process_tree_by_scan(root_pid: int, page: int) -> tuple[int, set[str]]:
    """:func:`process_tree` by reading every process's stat (kernels without ``children`` files)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is None:
            continue
        pid = int(entry.name)
        names[pid] = st[0]
        children.setdefault(st[1], []).append(pid)
        rss[pid] = st[2] * page
    total, seen, todo = 0, set(), [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        seen.add(names.get(pid, ""))
        todo.extend(children.get(pid, ()))
    return total, seen


def output_of(cmd: Sequence[str]) -> str:
    """The object a compile command writes: the argument after ``-o`` (or ``--output-file``)."""
    for i, arg in enumerate(cmd):
        if arg in ("-o", "--output-file") and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith("--output-file="):
            return arg.partition("=")[2]
    return cmd[-1] if cmd else ""


def threads_of(cmd: Sequence[str]) -> int:
    """nvcc's ``--threads N`` (or ``-t N``) on a command line; 1 without one."""
    threads = 1
    for i, arg in enumerate(cmd):
        if arg in ("--threads", "-t") and i + 1 < len(cmd) and cmd[i + 1].isdigit():
            threads = int(cmd[i + 1])
        elif arg.startswith("--threads=") and arg[10:].isdigit():
            threads = int(arg[10:])
    return threads


def exit_code(rc: int) -> int:
    """A process's exit status as a shell reports it: a signal N becomes 128 + N."""
    return rc if rc >= 0 else 128 - rc


def measure(cmd: Sequence[str], *, output: str, nvcc_threads: int = 1) -> tuple[UnitMeasure, set[str] | None]:
    """Run one command; its measure, and the names of the processes seen (None without /proc)."""
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


def append_measure(log: str | Path, m: UnitMeasure) -> None:
    """One O_APPEND write per unit: parallel jobs don't interleave their lines."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(asdict(m)) + "\n").encode())
    finally:
        os.close(fd)


def read_measures(path: Path) -> tuple[UnitMeasure, ...]:
    """Units appended by the ``unit`` / ``measure`` forms (last one per output wins)."""
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


def _cannot_run(cmd: Sequence[str], exc: OSError) -> int:
    print(f"kforge: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
    return 127


def run(out: str, cmd: Sequence[str]) -> int:
    """The ``run`` form: CMD's peak single-process RSS (``wait4``) into OUT.json."""
    try:
        proc = subprocess.Popen(list(cmd))
    except OSError as exc:
        return _cannot_run(cmd, exc)
    peak = 0
    if hasattr(os, "wait4"):
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    else:  # pragma: no cover - Windows has no wait4; the peak stays unmeasured (0)
        proc.wait()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"peak_rss": peak, "returncode": proc.returncode}, fh)
    return exit_code(proc.returncode)


def unit(log: str, cmd: Sequence[str], *, output: str | None = None, threads: int | None = None,
         filtered: bool = True) -> int:
    """The ``unit`` form (``filtered``: links run unmeasured, compiler-cache hits go unrecorded) and ``measure``."""
    try:
        if filtered and not COMPILE_FLAGS.intersection(cmd):  # links are not compile units
            return exit_code(subprocess.run(list(cmd)).returncode)
        m, names = measure(cmd, output=output or output_of(cmd), nvcc_threads=threads or threads_of(cmd))
    except OSError as exc:
        return _cannot_run(cmd, exc)
    if not (filtered and names is not None and not (names & WORKERS)):  # a cache hit compiled nothing
        append_measure(log, m)
    return exit_code(m.returncode)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if "--" not in args or not args or args[0] not in ("run", "unit", "measure"):
        print(USAGE, file=sys.stderr)
        return 2
    sep = args.index("--")
    opts, cmd = args[1:sep], args[sep + 1:]
    if not cmd:
        print(USAGE, file=sys.stderr)
        return 2
    if args[0] in ("run", "unit"):
        if len(opts) != 1:
            print(USAGE, file=sys.stderr)
            return 2
        return run(opts[0], cmd) if args[0] == "run" else unit(opts[0], cmd)
    kv = dict(zip(opts[::2], opts[1::2], strict=False))
    if "--log" not in kv or not kv.get("--threads", "1").isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    return unit(kv["--log"], cmd, output=kv.get("--output", cmd[-1]), threads=int(kv.get("--threads", "1")),
                filtered=False)


if __name__ == "__main__":  # pragma: no cover - exercised through subprocesses in tests
    sys.exit(main(sys.argv[1:]))
