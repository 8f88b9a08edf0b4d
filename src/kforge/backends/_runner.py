"""Run one backend build command: OOM retry, peak-memory wrapper, build log, live progress, failure summary.

:func:`run_step` runs one command through :func:`kforge.build.run.run_with_oom_retry` (one retry
with half the jobs after an out-of-memory kill), behind :mod:`kforge.build.measure`'s ``run`` wrapper
that measures the largest process. Every line goes to the build log; ninja's ``[n/m]`` lines drive a live
progress display (:class:`kforge.build.report.NinjaProgress`: units done of total, elapsed, ETA).
A failure is a :class:`BuildError` with the command, exit code, output tail and log path.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import kforge
from kforge.build.jobs import JobChoice
from kforge.build.measure import UnitMeasure, read_measures
from kforge.build.report import NinjaProgress, ProgressState
from kforge.build.run import run_with_oom_retry
from kforge.errors import BuildError
from kforge.plan import Plan

#: How often (seconds) progress is printed as a plain line when the console is not a terminal (CI logs).
PLAIN_INTERVAL = 30.0


@dataclass(frozen=True)
class StepOutcome:
    seconds: float
    peak_rss: int  # bytes, the largest single process over every attempt
    retried_with_jobs: int | None
    progress: ProgressState | None  # ninja's last [n/m] state, None if ninja never reported one
    choice: JobChoice  # the jobs the successful attempt ran with


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def expected_seconds(plan: Plan) -> float | None:
    """The plan's predicted build time where it comes from measured unit times (this host's, or the seed's)."""
    return plan.jobs.predicted_seconds if plan.jobs.order_from in ("measured", "seed") else None


class LiveProgress:
    """A rich progress bar fed by build output lines; plain lines every 30 s when not on a terminal."""

    def __init__(self, label: str, *, enabled: bool = True, console: Any = None,
                 clock: Callable[[], float] = time.monotonic, expected: float | None = None) -> None:
        self.label = label
        self.expected = expected  # the plan's predicted seconds, from measured unit times (None: no profile)
        self.enabled = enabled
        self._clock = clock
        self._console = console
        self._progress: Any = None
        self._task: Any = None
        self._last_plain = 0.0
        self.tracker = NinjaProgress(clock)
        self.seen: ProgressState | None = None

    def __enter__(self) -> LiveProgress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._console is None:
            self._console = Console(stderr=True)
        if self._console.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("units"),
                TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                console=self._console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=None, eta="")
        self._last_plain = self._clock()
        return self

    def restart(self) -> None:
        """A new attempt (after an OOM): ninja counts from the start again."""
        self.tracker = NinjaProgress(self._clock)

    def feed(self, line: str) -> None:
        state = self.tracker.feed(line)
        if state is None:
            return
        self.seen = state
        if not self.enabled:
            return
        if self._progress is not None:
            eta = self.eta(state)
            self._progress.update(self._task, completed=state.done, total=state.total,
                                  eta=f"ETA {fmt_seconds(eta)}" if eta is not None else "")
        elif self._console is not None and (
            self._clock() - self._last_plain >= PLAIN_INTERVAL or state.done == state.total
        ):
            self._last_plain = self._clock()
            self._console.print(self.plain(state), highlight=False)

    def eta(self, state: ProgressState) -> float | None:
        """Seconds left, only where something was measured: the rate of this build's units once a quarter of them
        (and at least two) are done, else the plan's prediction from measured unit times; else no ETA at all
        (one quick unit of seven said "ETA 3:43" for a build that ended 19 s later)."""
        if state.eta is not None and state.done >= max(2, state.total / 4):
            return state.eta
        if self.expected is not None:
            return max(0.0, self.expected - state.elapsed)
        return None

    def plain(self, state: ProgressState) -> str:
        eta = self.eta(state)
        return (f"{self.label}: {state.done}/{state.total} units, {fmt_seconds(state.elapsed)} elapsed"
                + (f", ETA {fmt_seconds(eta)}" if eta is not None else ""))

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


class BuildLog:
    """The combined output of every step of one build, appended line by line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = None

    def __enter__(self) -> BuildLog:
        self._fh = open(self.path, "a", encoding="utf-8", errors="replace", buffering=1)
        return self

    def write(self, line: str) -> None:
        assert self._fh is not None
        self._fh.write(line + "\n")

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def header(self, text: str) -> None:
        self.write(f"==== kforge: {text}")

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def run_step(
    argv: Sequence[str] | Callable[[JobChoice], Sequence[str]],
    *,
    env: Mapping[str, str],
    choice: JobChoice,
    log: BuildLog,
    label: str,
    work_dir: Path,
    cwd: Path | None = None,
    live: LiveProgress | None = None,
    python: str = sys.executable,
) -> StepOutcome:
    """Run one build command; see the module docstring. ``argv`` may depend on the job choice."""
    attempt = 0
    peak_files: list[Path] = []
    shown: list[str] = []

    def command(current: JobChoice) -> list[str]:
        nonlocal attempt
        attempt += 1
        real = list(argv(current) if callable(argv) else argv)
        shown[:] = real
        peak = Path(work_dir) / f".peak-{os.getpid()}-{id(peak_files):x}-{attempt}.json"
        peak_files.append(peak)
        log.header(f"{label} (attempt {attempt}, MAX_JOBS={current.max_jobs} NVCC_THREADS={current.nvcc_threads}): "
                   f"{shlex.join(real)}")
        if live is not None:
            live.restart()
        return [*peak_command(Path(work_dir)), "run", str(peak), "--", *real]

    def echo(line: str) -> None:
        log.write(line)
        if live is not None:
            live.feed(line)

    def note(msg: str) -> None:  # the OOM retry's announcement: in the log and on the console
        log.header(msg)
        _say(live, msg)

    start = time.monotonic()
    try:
        run = run_with_oom_retry(command, env, choice, cwd=cwd, echo=echo, log=note)
    except BuildError as exc:
        head = (exc.why or "").split("; last output:", 1)[0]
        log.flush()
        raise BuildError(
            f"{label} failed: {shlex.join(shown) if shown else '(no command)'}",
            why=f"{head}\n{summarize_failure(last_section(log.path))}",
            fix=f"{(exc.fix or '').rstrip('.')}; the full output is in {log.path}",
        ) from None
    finally:
        peak = max((_read_peak(p) for p in peak_files), default=0)
        for p in peak_files:
            p.unlink(missing_ok=True)
    return StepOutcome(
        seconds=time.monotonic() - start,
        peak_rss=peak,
        retried_with_jobs=run.choice.max_jobs if run.retried else None,
        progress=live.seen if live is not None else None,
        choice=run.choice,
    )


#: Lines that name an error in compiler / build-tool output (nvcc, gcc, MSVC, ninja, CMake, ptxas).
_ERROR = re.compile(r"(\berror\b|\bFAILED:|fatal error|CMake Error|undefined reference|\bKilled\b)", re.I)
#: pip's and setuptools' own words around a failed build: no information about the cause.
_NOISE = re.compile(r"subprocess-exited-with-error|This error originates from a subprocess|"
                    r"finished with status 'error'|"
                    r"Failed building wheel|Failed to build|ERROR: Failed to build installable|"
                    r"error: command '.*' failed with exit code|^\s*note: ", re.I)


def last_section(path: Path) -> str:
    """The output of the last command in a build log (after its last ``==== kforge:`` header)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    cut = text.rfind("\n==== kforge: ")
    return text[cut + 1:] if cut >= 0 else text


def _without_tracebacks(lines: list[str]) -> list[str]:
    """Drop Python traceback frames (the build backend's own stack), keep the exception line."""
    out: list[str] = []
    inside, indent = False, 0
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith("Traceback (most recent call last):"):
            inside, indent = True, len(line) - len(stripped)
            continue
        if inside and (len(line) - len(stripped) > indent or not stripped):
            continue
        inside = False
        out.append(line)
    return out


def summarize_failure(output: str, *, errors: int = 12, tail: int = 15) -> str:
    """The first error lines of a failed build, then the last lines of its output (tracebacks dropped)."""
    lines = [ln.rstrip() for ln in output.splitlines() if not ln.startswith("==== kforge: ")]
    lines = _without_tracebacks(lines)
    found = [ln.strip() for ln in lines if _ERROR.search(ln) and not _NOISE.search(ln)]
    last = [ln for ln in lines if ln.strip()][-tail:]
    parts = []
    if found:
        parts.append("first errors:\n" + "\n".join(list(dict.fromkeys(found))[:errors]))
    parts.append("last output:\n" + "\n".join(last))
    return "\n".join(parts)


def _say(live: LiveProgress | None, msg: str) -> None:
    if live is not None and live.enabled and live._console is not None:
        live._console.print(f"kforge: {msg}", highlight=False)
    else:
        print(f"kforge: {msg}", file=sys.stderr)


def _read_peak(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["peak_rss"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def find_ninja_logs(roots: Iterable[Path], since: float) -> tuple[Path, ...]:
    """Every ``.ninja_log`` under ``roots`` written at or after ``since`` (a ``time.time()``)."""
    found: set[Path] = set()
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for path in root.rglob(".ninja_log"):
            try:
                if path.is_file() and path.stat().st_mtime >= since - 1:
                    found.add(path.resolve())
            except OSError:
                continue
    return tuple(sorted(found))


_BOOT = """# Written by kforge: run kforge.build.measure with the sys.path of the kforge that wrote it.
import sys
sys.path[:0] = {paths!r}
from kforge.build.measure import main
sys.exit(main(sys.argv[1:]))
"""


def peak_command(directory: Path) -> list[str]:
    """``[python, -I, boot.py]``: the measuring wrapper, runnable from inside any build.

    A build under pip's isolation rewrites PYTHONPATH/site for its children, so a plain
    ``python -m kforge.build.measure`` there cannot import kforge. The boot file carries this
    interpreter's own sys.path (editable installs, PYTHONPATH on offline hosts), and ``-I`` keeps
    the build's environment from changing it.
    """
    paths = [str(Path(kforge.__file__).resolve().parents[1])] + [p for p in sys.path if p]
    boot = Path(directory) / "kforge_peak_boot.py"
    boot.parent.mkdir(parents=True, exist_ok=True)
    text = _BOOT.format(paths=list(dict.fromkeys(paths)))
    if not boot.is_file() or boot.read_text() != text:
        boot.write_text(text)
    return [sys.executable, "-I", str(boot)]


#: Languages whose compiles CMake can route through a launcher.
LAUNCHER_LANGS = ("C", "CXX", "CUDA")


def measuring_launcher(units_log: Path, env: Mapping[str, str], lang: str) -> str:
    """A CMake list for ``CMAKE_<LANG>_COMPILER_LAUNCHER``: kforge's unit measurer, then any launcher
    the env already names (ccache, sccache), so every compile unit's time and peak RSS is recorded."""
    ours = [*peak_command(units_log.parent), "unit", str(units_log), "--"]
    theirs = [p for p in env.get(f"CMAKE_{lang}_COMPILER_LAUNCHER", "").split(";") if p]
    return ";".join(ours + theirs)


def read_units(units_log: Path | None) -> tuple[UnitMeasure, ...]:
    """The compile units the measuring launcher recorded, without CMake's own probe compiles (``cmTC_*``)."""
    if units_log is None or not Path(units_log).exists():
        return ()
    return tuple(u for u in read_measures(units_log) if "cmTC_" not in u.output)


def which(program: str, env: Mapping[str, str]) -> str | None:
    """``shutil.which`` on the build's PATH (not kforge's own)."""
    return shutil.which(program, path=env.get("PATH"))


def place(src: Path, out_dir: Path) -> Path:
    """Move a finished artifact into ``out_dir`` (replacing one of the same name) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / src.name
    try:
        os.replace(src, dest)
    except OSError:  # another file system: copy next to it, then rename into place
        tmp = out_dir / f".{src.name}.tmp"
        shutil.copy2(src, tmp)
        os.replace(tmp, dest)
        src.unlink()
    return dest
