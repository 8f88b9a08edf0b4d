"""Memory-aware build parallelism: ``MAX_JOBS`` and ``NVCC_THREADS`` from measurements.

Every upstream guesses a GB-per-job constant (2.8, 3, 5, 8, 9) and either runs out of
memory or leaves cores idle. kforge instead keeps a small per-project profile of the
peak RSS and time of one compile unit (``<cache>/jobs/<project>.json``), updated after
every build, and sizes the build from the memory that is *available now*.

The model (used by :func:`choose_jobs`)
---------------------------------------
A compile unit of a project built for ``a`` archs with ``nvcc --threads t`` runs
``p = min(t, a)`` device compilations (cicc + ptxas, one per arch) side by side; more
threads than archs buy nothing.

* **Memory** of one unit: ``peak(p) = peak1 * (1 + beta * (p - 1))``. ``peak1`` is the
  measured peak RSS of a unit. nvcc's threads multiply memory only *partially*: the host
  pass (cudafe++, gcc) and cicc's front end are shared, and for flash-attn the measured
  peak did not grow at all from one arch to three with ``--threads 4`` (4.3 GB both,
  UPSTREAM_FACTS). ``beta`` (default 0.25, flash-attn seed 0.1) keeps a margin for
  projects whose per-arch ptxas is the big consumer.
* **Time** of one unit: ``T(p) = T1 * (s + (1 - s) * a / p)``, where ``T1`` is the time of
  a single-arch unit and ``s`` the arch-independent share (host pass; default 0.3).
* **Limits**: ``jobs * peak(p) <= available - headroom`` (headroom: max(2 GiB, 10 %) of
  what is available) and ``jobs * p <= cpus``.
* **Choice**: for each ``t`` in ``1..a`` take the most jobs both limits allow and
  estimate the wall time of ``units`` units as ``ceil(units / jobs) * T(p)``
  (a wave model; for the default "many units" it is throughput ``jobs / T(p)``).
  The fastest wins; ties go to fewer threads (less memory). With plenty of memory this
  gives one thread and one job per core (more units in flight beat more threads, since
  the host pass is not parallelised by ``--threads``); when memory is what binds, the
  spare cores go to nvcc threads instead.

The result never plans more memory than is available, with two exceptions, both flagged in
:attr:`JobChoice.reason`: an explicit user override (honoured), and a machine on which not even
one unit at one thread fits (then 1 x 1, which may still be OOM-killed: the reason says so).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kforge.errors import BuildError
from kforge.fsutil import atomic_write_text
from kforge.host import Resources
from kforge.measure import UnitMeasure

GiB = 1024**3
GB = 1000**3

#: Defaults of the model; a profile may carry its own.
DEFAULT_BETA = 0.25
DEFAULT_SERIAL_SHARE = 0.3
#: Used when nothing was ever measured for a project (stated as a guess in the reason).
DEFAULT_PEAK_RSS = int(3 * GiB)
DEFAULT_UNIT_SECONDS = 60.0
#: How many recent builds a profile remembers.
HISTORY = 8


# ---------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class JobProfile:
    """Measured cost of one compile unit of ``project`` built for ``arch_count`` archs."""

    project: str
    arch_count: int
    peak_rss_per_unit: int  # bytes: the largest unit seen (what memory must hold per job)
    unit_seconds: float  # median seconds of one unit at one nvcc thread
    unit_seconds_max: float
    samples: int  # compile units measured in total
    source: str  # "measured (N builds)", "seed: ...", "default guess"
    beta: float = DEFAULT_BETA
    serial_share: float = DEFAULT_SERIAL_SHARE
    history: tuple[tuple[int, float, float], ...] = field(default=(), repr=False)  # (peak, median s, max s) per build


#: Seeds from measurements in UPSTREAM_FACTS.md (flash-attn 2.8.3.post2, nvcc 13.0, sm_90,
#: 16-core H200): fwd units 4.3 GB / 123 s, bwd units 6.3 GB / 170 s, 73 units = 9678 s,
#: the longest 252 s; three archs with --threads 4 still peaked at 4.3 GB.
SEEDS: dict[str, JobProfile] = {
    "flash-attn": JobProfile(
        project="flash-attn",
        arch_count=1,
        peak_rss_per_unit=int(6.3 * GB),
        unit_seconds=9678 / 73,
        unit_seconds_max=252.0,
        samples=0,
        source="seed: UPSTREAM_FACTS (flash-attn 2.8.3.post2, sm_90, bwd unit 6.3 GB)",
        beta=0.1,
    ),
}


def _profile_path(cache_dir: Path, project: str) -> Path:
    return Path(cache_dir) / "jobs" / f"{project}.json"


def _read_profiles(path: Path) -> dict[str, dict]:
    """The usable entries of a profile file, by arch count. A damaged entry (hand-edited, cut
    short) counts as not measured: the next build measures again and overwrites it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    raw = data.get("arch_counts", {}) if isinstance(data, dict) else {}
    good: dict[str, dict] = {}
    for key, entry in (raw.items() if isinstance(raw, dict) else ()):
        try:
            _from_entry("check", int(key), entry)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        good[str(int(key))] = entry
    return good


def _from_entry(project: str, arch_count: int, entry: Mapping) -> JobProfile:
    history = tuple(tuple(h) for h in entry.get("history", ()))  # type: ignore[misc]
    return JobProfile(
        project=project,
        arch_count=arch_count,
        peak_rss_per_unit=int(entry["peak_rss_per_unit"]),
        unit_seconds=float(entry["unit_seconds"]),
        unit_seconds_max=float(entry.get("unit_seconds_max", entry["unit_seconds"])),
        samples=int(entry.get("samples", 0)),
        source=f"measured ({len(history) or 1} builds)",
        beta=float(entry.get("beta", DEFAULT_BETA)),
        serial_share=float(entry.get("serial_share", DEFAULT_SERIAL_SHARE)),
        history=history,  # type: ignore[arg-type]
    )


def load_profile(cache_dir: Path, project: str, arch_count: int) -> JobProfile:
    """The profile for this project and arch count: measured, else nearest measured, seed, or default."""
    entries = _read_profiles(_profile_path(cache_dir, project))
    if str(arch_count) in entries:
        return _from_entry(project, arch_count, entries[str(arch_count)])
    if entries:
        nearest = min((int(k) for k in entries), key=lambda k: (abs(k - arch_count), k))
        base = _from_entry(project, nearest, entries[str(nearest)])
        return _rescale(base, arch_count, f"measured for {nearest} archs, rescaled to {arch_count}")
    if project in SEEDS:
        return _rescale(SEEDS[project], arch_count, SEEDS[project].source)
    return JobProfile(
        project=project,
        arch_count=arch_count,
        peak_rss_per_unit=DEFAULT_PEAK_RSS,
        unit_seconds=DEFAULT_UNIT_SECONDS,
        unit_seconds_max=DEFAULT_UNIT_SECONDS,
        samples=0,
        source="default guess (nothing measured yet for this project)",
    )


def _rescale(base: JobProfile, arch_count: int, source: str) -> JobProfile:
    """Single-thread unit time grows with archs (device part per arch); peak memory does not."""
    if base.arch_count == arch_count:
        return replace(base, source=source)
    s = base.serial_share
    factor = (s + (1 - s) * arch_count) / (s + (1 - s) * base.arch_count)
    return replace(
        base,
        arch_count=arch_count,
        unit_seconds=base.unit_seconds * factor,
        unit_seconds_max=base.unit_seconds_max * factor,
        source=source,
        history=(),
    )


def record(cache_dir: Path, project: str, arch_count: int, units: Sequence[UnitMeasure]) -> JobProfile:
    """Fold one build's measured units into the project's profile (atomically) and return it."""
    good = [u for u in units if u.returncode == 0 and u.peak_rss > 0]
    if not good:
        return load_profile(cache_dir, project, arch_count)
    path = _profile_path(cache_dir, project)
    entries = _read_profiles(path)
    old = entries.get(str(arch_count), {})
    history = [tuple(h) for h in old.get("history", [])]
    # A unit run with t threads holds up to (1 + beta (t-1)) of the single-thread peak.
    beta = float(old.get("beta", SEEDS[project].beta if project in SEEDS else DEFAULT_BETA))
    peaks = [u.peak_rss / (1 + beta * (min(u.nvcc_threads, arch_count) - 1)) for u in good]
    secs = [u.seconds for u in good]
    history.append((int(max(peaks)), float(statistics.median(secs)), float(max(secs))))
    history = history[-HISTORY:]
    entry = {
        "peak_rss_per_unit": max(h[0] for h in history),
        "unit_seconds": float(statistics.median(h[1] for h in history)),
        "unit_seconds_max": max(h[2] for h in history),
        "samples": int(old.get("samples", 0)) + len(good),
        "beta": beta,
        "serial_share": float(old.get("serial_share", DEFAULT_SERIAL_SHARE)),
        "history": history,
    }
    entries[str(arch_count)] = entry
    atomic_write_text(path, json.dumps({"project": project, "arch_counts": entries}, indent=2, sort_keys=True))
    return _from_entry(project, arch_count, entry)


# ---------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class JobChoice:
    max_jobs: int
    nvcc_threads: int
    reason: str
    est_peak_memory: int = 0  # bytes, max_jobs * peak of one unit at nvcc_threads
    est_unit_seconds: float = 0.0
    #: Every variable that carries the nvcc thread count (the plan adds a project's own, e.g.
    #: FLASHINFER_NVCC_THREADS), so that an OOM retry lowers all of them, not only the generic one.
    thread_vars: tuple[str, ...] = ("NVCC_THREADS",)

    def env(self) -> dict[str, str]:
        """``MAX_JOBS``, ``CMAKE_BUILD_PARALLEL_LEVEL`` and every thread variable, as the build sees them."""
        out = {"MAX_JOBS": str(self.max_jobs), "CMAKE_BUILD_PARALLEL_LEVEL": str(self.max_jobs)}
        out.update({var: str(self.nvcc_threads) for var in self.thread_vars})
        return out

    def halved(self) -> JobChoice | None:
        """Half the memory: half the jobs, or half the nvcc threads once jobs is 1; None if nothing is left to halve."""
        if self.max_jobs > 1:
            jobs = self.max_jobs // 2
            return replace(self, max_jobs=jobs, est_peak_memory=self.est_peak_memory * jobs // self.max_jobs,
                           reason=f"halved after OOM: {self.max_jobs} -> {jobs} jobs")
        if self.nvcc_threads > 1:
            return replace(self, nvcc_threads=self.nvcc_threads // 2,
                           reason=f"halved after OOM: nvcc threads {self.nvcc_threads} -> {self.nvcc_threads // 2}")
        return None


def unit_memory(profile: JobProfile, threads: int) -> int:
    p = max(1, min(threads, profile.arch_count))
    return int(profile.peak_rss_per_unit * (1 + profile.beta * (p - 1)))


def unit_seconds(profile: JobProfile, threads: int) -> float:
    """Seconds of one unit with ``threads`` nvcc threads (``profile.unit_seconds`` is at one thread)."""
    a = max(1, profile.arch_count)
    p = max(1, min(threads, a))
    s = profile.serial_share
    return profile.unit_seconds * (s + (1 - s) * a / p) / (s + (1 - s) * a)


def headroom(host: Resources) -> int:
    return max(2 * GiB, host.mem_available // 10)


def choose_jobs(
    host: Resources,
    profile: JobProfile,
    *,
    override_max_jobs: int | None = None,
    override_nvcc_threads: int | None = None,
    units: int | None = None,
) -> JobChoice:
    """Pick ``MAX_JOBS`` and ``NVCC_THREADS`` for the shortest estimated wall time that fits in memory.

    ``units`` (the number of compile units, if known) lets the wave model see the tail: a
    build with fewer units than cores gives spare cores to nvcc threads. See the module
    docstring for the model.
    """
    budget = max(0, host.mem_available - headroom(host))
    what = (f"{profile.peak_rss_per_unit / GB:.1f} GB/unit ({profile.source}), "
            f"{host.describe()}, headroom {headroom(host) / GB:.1f} GB")
    if override_max_jobs is not None or override_nvcc_threads is not None:
        return _overridden(host, profile, budget, what, override_max_jobs, override_nvcc_threads, units)
    best: tuple[float, int, int] | None = None
    for t in range(1, max(1, profile.arch_count) + 1):
        jobs = _fit(host, profile, budget, t)
        if jobs < 1:
            continue
        wall = _estimate(profile, jobs, t, units)
        if best is None or wall < best[0] - 1e-9:
            best = (wall, jobs, t)
    if best is None:  # not even one single-thread unit fits: run one and say so
        need = unit_memory(profile, 1)
        return JobChoice(1, 1, f"1 job, 1 nvcc thread: one unit needs {need / GB:.1f} GB but only "
                         f"{budget / GB:.1f} GB is free after headroom; it may be OOM-killed; {what}",
                         need, unit_seconds(profile, 1))
    _, jobs, t = best
    binding = "memory" if jobs < host.cpus // max(1, min(t, profile.arch_count)) else "cpus"
    return JobChoice(jobs, t, f"{jobs} jobs x {t} nvcc threads ({binding}-bound): {what}",
                     jobs * unit_memory(profile, t), unit_seconds(profile, t))


def _fit(host: Resources, profile: JobProfile, budget: int, threads: int) -> int:
    p = max(1, min(threads, profile.arch_count))
    by_mem = budget // max(1, unit_memory(profile, threads))
    by_cpu = max(1, host.cpus // p)
    return int(min(by_mem, by_cpu))


def _estimate(profile: JobProfile, jobs: int, threads: int, units: int | None) -> float:
    t_unit = unit_seconds(profile, threads)
    if units is None:
        return t_unit / jobs  # seconds per unit at steady state
    return math.ceil(units / jobs) * t_unit


def _overridden(host, profile, budget, what, jobs, threads, units) -> JobChoice:
    t = threads if threads is not None else 1
    if jobs is None:
        jobs = max(1, _fit(host, profile, budget, t))
    if jobs < 1 or t < 1:
        raise BuildError(f"MAX_JOBS={jobs} / NVCC_THREADS={t} is not a positive count",
                         fix="give positive integers, or leave them unset so kforge chooses")
    mem = jobs * unit_memory(profile, t)
    warn = ""
    if mem > budget:
        warn = (f"; WARNING: estimated {mem / GB:.1f} GB exceeds the {budget / GB:.1f} GB available "
                f"after headroom; an OOM is retried once with half the jobs")
    return JobChoice(jobs, t, f"{jobs} jobs x {t} nvcc threads (user override){warn}: {what}",
                     mem, unit_seconds(profile, t))
