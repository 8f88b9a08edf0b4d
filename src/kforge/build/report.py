"""The build report: time and peak RSS per compile unit, and a timeline picture.

Inputs are ninja's own ``.ninja_log`` (what ran when) and, where the compile commands
were wrapped by ``python -m kforge.build.measure measure``, the measured peak RSS per unit.
Outputs are ``report.json``, ``timeline.html`` and ``timeline.svg`` (a self-contained SVG Gantt chart of
units over job lanes). :class:`NinjaProgress` turns ninja's ``[n/m]`` status lines into
units done out of total, elapsed time and an ETA, shown live with rich.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kforge.errors import BuildError
from kforge.fsutil import atomic_write_text

# ---------------------------------------------------------------------------- .ninja_log


@dataclass(frozen=True)
class NinjaEntry:
    start_ms: int
    end_ms: int
    mtime: int
    output: str
    cmd_hash: str


_HEADER = re.compile(r"# ninja log v(\d+)")


def parse_ninja_log(path: Path, *, last_build_only: bool = True) -> tuple[NinjaEntry, ...]:
    """Entries of a ``.ninja_log`` (v5, v6, v7: ``start end mtime output hash``, tab-separated).

    Ninja appends one line per finished edge, so within one build end times never go
    down; a drop marks the start of a later build. With ``last_build_only`` only the last
    build's entries are returned (and of those, the last entry per output).
    """
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        raise BuildError(f"cannot read the ninja log {path}", why=str(exc),
                         fix="build with ninja (torch's BuildExtension and CMake -G Ninja both do)") from exc
    if not lines or not (m := _HEADER.match(lines[0])):
        raise BuildError(f"{path} is not a ninja log", why="the first line is not '# ninja log vN'")
    if int(m.group(1)) < 5:
        raise BuildError(f"{path} is a ninja log v{m.group(1)}", why="kforge reads v5 and later",
                         fix="use ninja >= 1.5")
    builds: list[list[NinjaEntry]] = [[]]
    last_end = -1
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) != 5:
            continue
        try:
            entry = NinjaEntry(int(parts[0]), int(parts[1]), int(parts[2]), parts[3], parts[4])
        except ValueError:
            continue
        if entry.end_ms < last_end:
            builds.append([])
        last_end = entry.end_ms
        builds[-1].append(entry)
    chosen = builds[-1] if last_build_only else [e for b in builds for e in b]
    latest: dict[str, NinjaEntry] = {}
    for e in chosen:
        latest[e.output] = e
    return tuple(sorted(latest.values(), key=lambda e: (e.start_ms, e.output)))


# ---------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class UnitReport:
    output: str
    start_s: float
    end_s: float
    seconds: float
    lane: int
    peak_rss: int | None = None  # bytes, when measured


@dataclass(frozen=True)
class BuildReport:
    units: tuple[UnitReport, ...]
    wall_seconds: float
    busy_seconds: float  # sum of unit times
    max_parallel: int  # lanes used
    peak_rss_max: int | None
    title: str = ""

    def slowest(self, n: int = 5) -> tuple[UnitReport, ...]:
        return tuple(sorted(self.units, key=lambda u: -u.seconds)[:n])


def _assign_lanes(entries: Sequence[NinjaEntry]) -> list[int]:
    free_at: list[int] = []  # lane -> end_ms
    lanes = []
    for e in entries:  # sorted by start
        for i, end in enumerate(free_at):
            if end <= e.start_ms:
                free_at[i] = e.end_ms
                lanes.append(i)
                break
        else:
            free_at.append(e.end_ms)
            lanes.append(len(free_at) - 1)
    return lanes


def build_report(entries: Sequence[NinjaEntry], peaks: Mapping[str, int] | None = None, *,
                 title: str = "") -> BuildReport:
    """Combine ninja's timings with measured peak RSS (keyed by output path)."""
    entries = sorted(entries, key=lambda e: (e.start_ms, e.output))
    peaks = dict(peaks or {})
    if not entries:
        return BuildReport((), 0.0, 0.0, 0, None, title)
    t0 = min(e.start_ms for e in entries)
    lanes = _assign_lanes(entries)
    units = tuple(
        UnitReport(e.output, (e.start_ms - t0) / 1000, (e.end_ms - t0) / 1000, (e.end_ms - e.start_ms) / 1000,
                   lane, _peak_for(e.output, peaks))
        for e, lane in zip(entries, lanes, strict=True)
    )
    measured = [u.peak_rss for u in units if u.peak_rss is not None]
    return BuildReport(
        units=units,
        wall_seconds=(max(e.end_ms for e in entries) - t0) / 1000,
        busy_seconds=sum(u.seconds for u in units),
        max_parallel=max(lanes) + 1,
        peak_rss_max=max(measured) if measured else None,
        title=title,
    )


def _peak_for(output: str, peaks: Mapping[str, int]) -> int | None:
    if output in peaks:
        return peaks[output]
    for key, value in peaks.items():  # the wrapper may have seen an absolute path
        if key.endswith("/" + output) or output.endswith("/" + key):
            return value
    return None


def write_report(report: BuildReport, out_dir: Path, *,
                 sections: Mapping[str, object] | None = None) -> tuple[Path, Path]:
    """Write ``report.json``, ``timeline.html`` and ``timeline.svg`` (the same chart, for docs) into ``out_dir``;
    return the paths of the first two.

    ``sections`` are added to ``report.json`` as they are (e.g. ``arch_enforcement``).
    """
    out_dir = Path(out_dir)
    data = {
        "title": report.title,
        "wall_seconds": report.wall_seconds,
        "busy_seconds": report.busy_seconds,
        "max_parallel": report.max_parallel,
        "peak_rss_max": report.peak_rss_max,
        "units": [asdict(u) for u in report.units],
        **dict(sections or {}),
    }
    json_path, html_path = out_dir / "report.json", out_dir / "timeline.html"
    atomic_write_text(json_path, json.dumps(data, indent=2) + "\n")
    atomic_write_text(html_path, timeline_html(report))
    atomic_write_text(out_dir / "timeline.svg", '<?xml version="1.0" encoding="utf-8"?>\n' + timeline_svg(report) + "\n")
    return json_path, html_path


def timeline_html(report: BuildReport, *, width: int = 1100, row: int = 22) -> str:
    """A self-contained HTML page with the SVG Gantt chart of :func:`timeline_svg`."""
    peak = f", peak unit RSS {report.peak_rss_max / 1e9:.2f} GB" if report.peak_rss_max else ""
    summary = html.escape(f"{len(report.units)} units, wall {report.wall_seconds:.1f} s, "
                          f"busy {report.busy_seconds:.1f} s, {report.max_parallel} parallel{peak}")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(report.title or 'kforge build timeline')}</title></head>"
        f"<body style=\"font-family:sans-serif\"><h3>{html.escape(report.title or 'build timeline')}</h3>"
        f"<p>{summary}</p>{timeline_svg(report, width=width, row=row)}</body></html>\n"
    )


def timeline_svg(report: BuildReport, *, width: int = 1100, row: int = 22) -> str:
    """An SVG Gantt chart: units as bars over time, one row per job lane (red shades: measured peak RSS)."""
    wall = max(report.wall_seconds, 1e-3)
    left, top = 60, 30
    height = top + row * max(report.max_parallel, 1) + 30
    scale = (width - left - 10) / wall
    peak_hi = max((u.peak_rss or 0) for u in report.units) if report.units else 0
    bars = []
    for u in report.units:
        x, w = left + u.start_s * scale, max(1.0, u.seconds * scale)
        y = top + u.lane * row
        shade = 0.35 + 0.65 * ((u.peak_rss or 0) / peak_hi) if peak_hi else 0.6
        color = f"rgba(200,60,40,{shade:.2f})" if u.peak_rss else "rgba(70,110,200,0.7)"
        rss = f", peak {u.peak_rss / 1e9:.2f} GB" if u.peak_rss else ""
        tip = html.escape(f"{u.output}: {u.seconds:.1f} s{rss}")
        label = html.escape(Path(u.output).name)
        bars.append(f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" '
                    f'fill="{color}" stroke="#333" stroke-width="0.5"/>'
                    f'<text x="{x + 3:.1f}" y="{y + row - 8}" font-size="10" clip-path="none">'
                    f'{label if w > 60 else ""}</text></g>')
    ticks = []
    step = _tick_step(wall)
    t = 0.0
    while t <= wall + 1e-9:
        x = left + t * scale
        ticks.append(f'<line x1="{x:.1f}" y1="{top - 5}" x2="{x:.1f}" y2="{height - 25}" stroke="#ddd"/>'
                     f'<text x="{x:.1f}" y="{height - 10}" font-size="10" text-anchor="middle">{t:g}s</text>')
        t += step
    lanes = "".join(f'<text x="5" y="{top + i * row + row - 8}" font-size="10">job {i + 1}</text>'
                    for i in range(report.max_parallel))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
            f"{''.join(ticks)}{lanes}{''.join(bars)}</svg>")


def _tick_step(wall: float) -> float:
    for step in (0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800):
        if wall / step <= 12:
            return step
    return 3600.0


# ---------------------------------------------------------------------------- live progress

_STATUS = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")


@dataclass(frozen=True)
class ProgressState:
    done: int
    total: int
    elapsed: float
    eta: float | None  # seconds left, None before the first unit finishes
    last: str = ""


class NinjaProgress:
    """Feed ninja's output lines; read units done out of total, elapsed and ETA.

    The ETA is ``elapsed / done * (total - done)``: the average pace so far, which is
    what a build of many similar units converges to.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self.state = ProgressState(0, 0, 0.0, None)

    def feed(self, line: str) -> ProgressState | None:
        m = _STATUS.match(line.strip())
        if not m:
            return None
        done, total = int(m.group(1)), int(m.group(2))
        elapsed = self._clock() - self._start
        eta = elapsed / done * (total - done) if done else None
        self.state = ProgressState(done, total, elapsed, eta, m.group(3)[:120])
        return self.state
