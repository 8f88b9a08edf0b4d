"""Build parallelism from measurements: ``MAX_JOBS`` and ``NVCC_THREADS`` for the shortest predicted build that fits.

Every upstream guesses a GB-per-job constant (2.8, 3, 5, 8, 9) and either runs out of
memory or leaves cores idle. kforge instead keeps a small per-project profile of the
peak RSS and the time of every compile unit (``<cache>/jobs/<project>.json``), updated after
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
* **Contention**: a unit at ``L`` busy compile processes takes ``c(L)`` times its uncontended time;
  ``c`` is this host's, learnt from earlier builds' unit times at different job counts
  (``<cache>/jobs/host.json``), else :func:`kforge.build.makespan.default_curve`.
* **Choice**: every ``(jobs, t)`` within both limits is simulated (:func:`predict`): the measured unit
  times (per unit, from the profile; the flash-attn seed's unit kinds before anything is measured),
  each times the thread factor and ``c(jobs x p)``, scheduled longest first on ``jobs`` slots (what
  kforge's ninja shim makes ninja do, :mod:`kforge.build.ninjaorder`). The shortest predicted makespan wins;
  within :data:`TIE` of it, the fewest processes. Not "fill every core": when one long unit bounds the
  build, or contention grows faster than the slots, fewer jobs win. With no unit times and no unit count
  the per-unit throughput ``jobs / (T(p) c(jobs x p))`` is compared instead (no makespan is claimed).

The result never plans more memory than is available, with two exceptions, both flagged in
:attr:`JobChoice.reason`: an explicit user override (honoured), and a machine on which not even
one unit at one thread fits (then 1 x 1, which may still be OOM-killed: the reason says so).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kforge.build import makespan
from kforge.build.host import Resources
from kforge.build.makespan import DEFAULT_FULL_LOAD_FACTOR, Contention, Schedule, default_curve, simulate
from kforge.build.measure import UnitMeasure
from kforge.build.ninjaorder import unit_key
from kforge.errors import BuildError
from kforge.fsutil import atomic_write_text

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
#: How many recent builds' per-unit times a profile keeps (order, makespan, contention).
UNIT_BUILDS = 4
#: Candidates whose predicted makespan is within this share of the best count as equal: fewer processes win.
TIE = 0.005


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
    #: Recent builds' unit times: (load, nvcc threads, ((unit key, seconds), ...)); load = jobs x processes per unit.
    unit_builds: tuple[tuple[float, int, tuple[tuple[str, float], ...]], ...] = field(default=(), repr=False)
    unit_count: int | None = None  # compile units of one build (measured, or the seed's)
    contention: Contention | None = None  # this host's, from <cache>/jobs/host.json; None: the default curve
    #: Before any unit was measured here: (file-name glob, seconds, count) per kind of unit, longest first (seeds only).
    seed_units: tuple[tuple[str, float, int], ...] = ()


#: flash-attn 2.8.3.post2's 73 units for sm_90 as measured in one kforge build on the `nvidia-h200` host
#: (16 cores, 16 jobs x 1 nvcc thread, 2026-11-23, docs/verified.md): seconds at 16 concurrent jobs, summing
#: to 16,702 s. The seed divides them by the default contention factor at 16 jobs (kforge.build.makespan). That
#: factor, 1.73, was itself fitted as 16,702 / 9,678 (upstream's 8-job build, UPSTREAM_FACTS), so the seed's
#: 9,654 s total agrees with 9,678 s by construction, not as a cross-check. Predictions between 8 and 16 jobs
#: interpolate a curve with no measured point there: estimates until a host measures its own.
_FA2_UNITS_AT_16_JOBS: tuple[tuple[str, float], ...] = (
    ("flash_fwd_split_hdim64_fp16_sm80.o", 432.9), ("flash_fwd_split_hdim64_bf16_sm80.o", 405.5),
    ("flash_fwd_split_hdim128_fp16_sm80.o", 379.0), ("flash_fwd_split_hdim256_bf16_sm80.o", 373.6),
    ("flash_fwd_split_hdim256_fp16_sm80.o", 373.5), ("flash_fwd_split_hdim128_bf16_sm80.o", 359.3),
    ("flash_fwd_split_hdim96_fp16_sm80.o", 355.9), ("flash_bwd_hdim256_bf16_sm80.o", 349.2),
    ("flash_bwd_hdim256_fp16_sm80.o", 342.8), ("flash_fwd_split_hdim96_bf16_sm80.o", 337.1),
    ("flash_fwd_split_hdim192_fp16_sm80.o", 317.4), ("flash_bwd_hdim128_bf16_sm80.o", 313.5),
    ("flash_fwd_split_hdim32_fp16_sm80.o", 313.3), ("flash_bwd_hdim128_fp16_sm80.o", 305.5),
    ("flash_fwd_split_hdim32_bf16_sm80.o", 301.1), ("flash_bwd_hdim64_bf16_sm80.o", 298.9),
    ("flash_bwd_hdim64_fp16_sm80.o", 298.7), ("flash_fwd_split_hdim192_bf16_sm80.o", 296.7),
    ("flash_fwd_hdim256_fp16_sm80.o", 273.7), ("flash_bwd_hdim96_fp16_sm80.o", 268.3),
    ("flash_fwd_hdim256_bf16_sm80.o", 266.3), ("flash_bwd_hdim96_bf16_sm80.o", 256.4),
    ("flash_fwd_split_hdim64_fp16_causal_sm80.o", 255.8), ("flash_bwd_hdim192_bf16_sm80.o", 253.9),
    ("flash_fwd_split_hdim64_bf16_causal_sm80.o", 250.0), ("flash_bwd_hdim192_fp16_sm80.o", 248.3),
    ("flash_fwd_hdim128_bf16_sm80.o", 241.5), ("flash_bwd_hdim32_fp16_sm80.o", 241.1),
    ("flash_fwd_hdim128_fp16_sm80.o", 240.9), ("flash_bwd_hdim32_bf16_sm80.o", 228.5),
    ("flash_fwd_split_hdim128_fp16_causal_sm80.o", 226.3), ("flash_fwd_split_hdim256_fp16_causal_sm80.o", 225.9),
    ("flash_bwd_hdim256_fp16_causal_sm80.o", 223.6), ("flash_fwd_split_hdim128_bf16_causal_sm80.o", 218.9),
    ("flash_bwd_hdim128_bf16_causal_sm80.o", 217.1), ("flash_fwd_split_hdim256_bf16_causal_sm80.o", 214.1),
    ("flash_bwd_hdim128_fp16_causal_sm80.o", 213.4), ("flash_fwd_split_hdim96_fp16_causal_sm80.o", 212.2),
    ("flash_bwd_hdim256_bf16_causal_sm80.o", 211.9), ("flash_fwd_split_hdim96_bf16_causal_sm80.o", 205.2),
    ("flash_fwd_hdim128_fp16_causal_sm80.o", 203.5), ("flash_bwd_hdim64_bf16_causal_sm80.o", 198.0),
    ("flash_fwd_split_hdim32_fp16_causal_sm80.o", 196.1), ("flash_fwd_split_hdim192_fp16_causal_sm80.o", 195.2),
    ("flash_fwd_hdim128_bf16_causal_sm80.o", 193.6), ("flash_bwd_hdim64_fp16_causal_sm80.o", 191.7),
    ("flash_fwd_split_hdim32_bf16_causal_sm80.o", 190.4), ("flash_bwd_hdim96_bf16_causal_sm80.o", 183.7),
    ("flash_fwd_split_hdim192_bf16_causal_sm80.o", 183.6), ("flash_fwd_hdim256_bf16_causal_sm80.o", 183.3),
    ("flash_fwd_hdim192_bf16_sm80.o", 181.6), ("flash_fwd_hdim64_fp16_sm80.o", 181.5),
    ("flash_fwd_hdim256_fp16_causal_sm80.o", 180.9), ("flash_fwd_hdim64_bf16_sm80.o", 179.1),
    ("flash_bwd_hdim96_fp16_causal_sm80.o", 179.0), ("flash_fwd_hdim192_fp16_sm80.o", 177.4),
    ("flash_bwd_hdim192_fp16_causal_sm80.o", 168.7), ("flash_fwd_hdim96_fp16_causal_sm80.o", 165.8),
    ("flash_fwd_hdim32_bf16_sm80.o", 164.0), ("flash_bwd_hdim192_bf16_causal_sm80.o", 162.5),
    ("flash_fwd_hdim96_fp16_sm80.o", 159.2), ("flash_fwd_hdim96_bf16_causal_sm80.o", 158.9),
    ("flash_fwd_hdim96_bf16_sm80.o", 158.0), ("flash_fwd_hdim32_fp16_sm80.o", 153.2),
    ("flash_bwd_hdim32_bf16_causal_sm80.o", 150.9), ("flash_bwd_hdim32_fp16_causal_sm80.o", 147.9),
    ("flash_fwd_hdim192_bf16_causal_sm80.o", 131.6), ("flash_fwd_hdim64_bf16_causal_sm80.o", 128.8),
    ("flash_fwd_hdim64_fp16_causal_sm80.o", 127.4), ("flash_fwd_hdim192_fp16_causal_sm80.o", 126.4),
    ("flash_fwd_hdim32_bf16_causal_sm80.o", 110.3), ("flash_fwd_hdim32_fp16_causal_sm80.o", 104.2),
    ("flash_api.o", 38.8),
)
_FA2_SEED_UNITS = tuple((name, seconds / DEFAULT_FULL_LOAD_FACTOR, 1) for name, seconds in _FA2_UNITS_AT_16_JOBS)

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
        source="seed: UPSTREAM_FACTS (flash-attn 2.8.3.post2, sm_90, bwd unit 6.3 GB; unit times from the H200 build)",
        beta=0.1,
        unit_count=73,
        seed_units=_FA2_SEED_UNITS,
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


def _unit_builds(raw: object) -> tuple[tuple[float, int, tuple[tuple[str, float], ...]], ...]:
    out = []
    for load, threads, units in raw or ():  # type: ignore[union-attr]
        out.append((float(load), int(threads), tuple(sorted((str(k), float(v)) for k, v in dict(units).items()))))
    return tuple(out)


def _from_entry(project: str, arch_count: int, entry: Mapping) -> JobProfile:
    history = tuple(tuple(h) for h in entry.get("history", ()))  # type: ignore[misc]
    builds = _unit_builds(entry.get("unit_builds", ()))
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
        unit_builds=builds,
        unit_count=len(builds[-1][2]) if builds else None,
    )


def load_profile(cache_dir: Path, project: str, arch_count: int) -> JobProfile:
    """The profile for this project and arch count (measured, else nearest measured, seed, or default),
    with this host's measured contention curve where there is one."""
    return replace(_load_profile(cache_dir, project, arch_count), contention=load_contention(cache_dir))


def _load_profile(cache_dir: Path, project: str, arch_count: int) -> JobProfile:
    entries = _read_profiles(_profile_path(cache_dir, project))
    if str(arch_count) in entries:
        return _from_entry(project, arch_count, entries[str(arch_count)])
    if entries:
        nearest = min((int(k) for k in entries), key=lambda k: (abs(k - arch_count), k))
        base = _from_entry(project, nearest, entries[str(nearest)])
        return for_arch_count(base, arch_count, f"measured for {nearest} archs, rescaled to {arch_count}")
    if project in SEEDS:
        return for_arch_count(SEEDS[project], arch_count, SEEDS[project].source)
    return JobProfile(
        project=project,
        arch_count=arch_count,
        peak_rss_per_unit=DEFAULT_PEAK_RSS,
        unit_seconds=DEFAULT_UNIT_SECONDS,
        unit_seconds_max=DEFAULT_UNIT_SECONDS,
        samples=0,
        source="default guess (nothing measured yet for this project)",
    )


def for_arch_count(base: JobProfile, arch_count: int, source: str | None = None) -> JobProfile:
    """``base`` rescaled to ``arch_count`` archs: single-thread unit time grows with archs (device part per
    arch), peak memory does not. Unit times are rescaled by the same factor (their order is kept)."""
    if base.arch_count == arch_count:
        return replace(base, source=source) if source else base
    source = source or f"{base.source}, rescaled to {arch_count} archs"
    s = base.serial_share
    factor = (s + (1 - s) * arch_count) / (s + (1 - s) * base.arch_count)
    return replace(
        base,
        arch_count=arch_count,
        unit_seconds=base.unit_seconds * factor,
        unit_seconds_max=base.unit_seconds_max * factor,
        source=source,
        history=(),
        unit_builds=tuple((load, t, tuple((k, v * factor) for k, v in units)) for load, t, units in base.unit_builds),
        seed_units=tuple((glob, v * factor, n) for glob, v, n in base.seed_units),
    )


def record(cache_dir: Path, project: str, arch_count: int, units: Sequence[UnitMeasure], *,
           jobs: int | None = None, cpus: int | None = None) -> JobProfile:
    """Fold one build's measured units into the project's profile (atomically) and return it.

    With ``jobs`` (the MAX_JOBS the units ran under) the unit times are kept by name with their load, for
    the longest-first order and the makespan model; with ``cpus`` too, this host's contention curve is
    learnt again from the builds at different loads (``<cache>/jobs/host.json``).
    """
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
        "unit_builds": [list(b) for b in old.get("unit_builds", [])],
    }
    if jobs is not None and jobs >= 1:
        threads = int(statistics.median(min(max(1, u.nvcc_threads), max(1, arch_count)) for u in good))
        times: dict[str, float] = {}
        for u in good:
            times[unit_key(u.output)] = max(times.get(unit_key(u.output), 0.0), float(u.seconds))
        entry["unit_builds"] = (entry["unit_builds"] + [[float(jobs * threads), threads, times]])[-UNIT_BUILDS:]
    entries[str(arch_count)] = entry
    atomic_write_text(path, json.dumps({"project": project, "arch_counts": entries}, indent=2, sort_keys=True))
    profile = _from_entry(project, arch_count, entry)
    if cpus is not None and profile.unit_builds:
        # Only a build with at least two units per job slot held its load for most of its run; a small project
        # (fmha: 7 units under MAX_JOBS=16) never ran 16 at once and would teach the host a false "no slowdown".
        sustained = [(load, t, units) for load, t, units in profile.unit_builds if len(units) >= 2 * load / max(1, t)]
        learnt = makespan.learn([(load, dict((k, v / _thread_factor(profile, t)) for k, v in units))
                                 for load, t, units in sustained], cpus)
        if learnt is not None:
            save_contention(cache_dir, learnt)
    return replace(profile, contention=load_contention(cache_dir))


def _host_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / "jobs" / "host.json"


def load_contention(cache_dir: Path) -> Contention | None:
    """This host's measured contention curve, or None (then :func:`makespan.default_curve` applies)."""
    try:
        data = json.loads(_host_path(cache_dir).read_text())
        points = tuple((float(x), float(y)) for x, y in data["points"])
        if len(points) < 2 or any(y <= 0 for _, y in points):
            return None
        return Contention(points, str(data.get("source", "measured on this host")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_contention(cache_dir: Path, curve: Contention) -> None:
    atomic_write_text(_host_path(cache_dir), json.dumps({"points": [list(p) for p in curve.points],
                                                        "source": curve.source}, indent=2))


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
    predicted_seconds: float | None = None  # the makespan model's prediction for the whole build, if it had one
    #: (unit key, uncontended seconds) longest first: the order kforge's ninja shim starts units in; () = upstream's
    order: tuple[tuple[str, float], ...] = field(default=(), repr=False)
    order_from: str = ""  # "measured" (this host's earlier builds), "seed" (kforge.build.jobs.SEEDS), "" (no order)

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
                           predicted_seconds=None, reason=f"halved after OOM: {self.max_jobs} -> {jobs} jobs")
        if self.nvcc_threads > 1:
            return replace(self, nvcc_threads=self.nvcc_threads // 2, predicted_seconds=None,
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


def _thread_factor(profile: JobProfile, threads: int) -> float:
    """A unit's time at ``threads`` nvcc threads over its time at one (threads help only with > 1 arch)."""
    a = max(1, profile.arch_count)
    p = max(1, min(threads, a))
    s = profile.serial_share
    return (s + (1 - s) * a / p) / (s + (1 - s) * a)


def _order_from(profile: JobProfile) -> str:
    return "measured" if profile.unit_builds else "seed" if profile.seed_units else ""


def contention(profile: JobProfile, cpus: int) -> Contention:
    """The contention curve a prediction uses: this host's measured one, else :func:`makespan.default_curve`."""
    return profile.contention or default_curve(cpus)


def unit_times(profile: JobProfile, cpus: int) -> tuple[tuple[str, float], ...]:
    """Each measured unit's uncontended single-thread seconds, from its latest build (longest first).

    A time measured at load ``L`` with ``t`` threads is divided by the contention factor ``c(L)`` and by
    the thread factor of ``t``: what the makespan model and the ninja shim's order start from.
    """
    if not profile.unit_builds and profile.seed_units:
        return tuple((glob, seconds) for glob, seconds, _ in profile.seed_units)
    curve = contention(profile, cpus)
    latest: dict[str, float] = {}
    for load, threads, units in profile.unit_builds:
        div = curve.factor(load) * _thread_factor(profile, threads)
        latest.update({k: v / div for k, v in units})
    return tuple(sorted(latest.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True)
class _Work:
    """What the makespan is predicted from."""

    units: tuple[tuple[str, float], ...]  # (name, uncontended single-thread seconds); empty: a steady stream
    count: int | None  # units in a steady stream (with ``units`` empty)
    how: str


def _work(profile: JobProfile, cpus: int, units: int | None) -> _Work:
    if profile.unit_builds:
        measured = unit_times(profile, cpus)
        return _Work(measured, None, f"LPT schedule of {len(measured)} measured units")
    if profile.seed_units and units is None:
        expanded = tuple((f"{glob}#{i}", seconds) for glob, seconds, n in profile.seed_units for i in range(n))
        return _Work(expanded, None, f"estimate: LPT schedule of the seed's {len(expanded)} unit times "
                     f"({sum(t for _, t in expanded):.0f} s uncontended; measured on another host)")
    if units is not None:
        return _Work(tuple((f"unit{i}", profile.unit_seconds) for i in range(units)), None,
                     f"estimate: {units} units of {profile.unit_seconds:.0f} s")
    if profile.unit_count:
        return _Work((), profile.unit_count, f"estimate: {profile.unit_count} units of {profile.unit_seconds:.0f} s "
                     "as a steady stream, no per-unit times yet")
    return _Work((), None, "no unit count or times yet: seconds per unit at steady state")


def predict(profile: JobProfile, cpus: int, jobs: int, threads: int, *,
            units: int | None = None) -> tuple[float, Schedule | None, str]:
    """(predicted seconds, the simulated schedule if per-unit times exist, how it was predicted) for ``jobs`` x ``threads``.

    Without per-unit times or a unit count the number is seconds per unit at steady state, not a makespan.
    """
    curve = contention(profile, cpus)
    p = max(1, min(threads, profile.arch_count))
    scale = _thread_factor(profile, threads) * curve.factor(jobs * p)
    work = _work(profile, cpus, units)
    if work.units:
        schedule = simulate([(k, v * scale) for k, v in work.units], jobs)
        return schedule.makespan, schedule, work.how
    t_unit = profile.unit_seconds * scale
    if work.count:
        return max(t_unit, work.count * t_unit / jobs), None, work.how
    return t_unit / jobs, None, work.how


def choose_jobs(
    host: Resources,
    profile: JobProfile,
    *,
    override_max_jobs: int | None = None,
    override_nvcc_threads: int | None = None,
    units: int | None = None,
) -> JobChoice:
    """Pick ``MAX_JOBS`` and ``NVCC_THREADS`` for the shortest predicted makespan that fits in memory.

    Every (jobs, threads) within the memory budget and the cores is simulated (:func:`predict`):
    longest-first list scheduling of the measured unit times, each slowed by this host's contention
    factor at ``jobs x min(threads, archs)`` busy processes. Within :data:`TIE` of the best, the
    candidate with the fewest processes wins (less memory, less contention for the same time).
    ``units`` (a unit count) stands in when no per-unit times were measured.
    """
    budget = max(0, host.mem_available - headroom(host))
    curve = contention(profile, host.cpus)
    profile = replace(profile, contention=curve)  # chosen once: predict and unit_times below reuse it
    what = (f"{profile.peak_rss_per_unit / GB:.1f} GB/unit ({profile.source}), "
            f"{host.describe()}, headroom {headroom(host) / GB:.1f} GB; contention: {curve.source}")
    if override_max_jobs is not None or override_nvcc_threads is not None:
        return _overridden(host, profile, budget, what, override_max_jobs, override_nvcc_threads, units)
    candidates: list[tuple[float, int, int, int, str]] = []
    for t in range(1, max(1, profile.arch_count) + 1):
        p = max(1, min(t, profile.arch_count))
        for jobs in range(1, _fit(host, profile, budget, t) + 1):
            seconds, _, how = predict(profile, host.cpus, jobs, t, units=units)
            candidates.append((seconds, jobs * p, jobs, t, how))
    if not candidates:  # not even one single-thread unit fits: run one and say so
        need = unit_memory(profile, 1)
        return JobChoice(1, 1, f"1 job, 1 nvcc thread: one unit needs {need / GB:.1f} GB but only "
                         f"{budget / GB:.1f} GB is free after headroom; it may be OOM-killed; {what}",
                         need, unit_seconds(profile, 1))
    best = min(c[0] for c in candidates)
    seconds, _, jobs, t, how = min((c for c in candidates if c[0] <= best * (1 + TIE) + 1e-9),
                                   key=lambda c: (c[1], c[2], c[0]))
    p = max(1, min(t, profile.arch_count))
    fit = _fit(host, profile, budget, t)
    binding = ("cpus-bound" if jobs == max(1, host.cpus // p) else "memory-bound" if jobs == fit
               else "more jobs predicted no faster")
    makespan = how.startswith(("LPT", "estimate"))
    said = (f"predicted makespan {seconds:.0f} s ({how})" if makespan
            else f"predicted {seconds:.1f} s per unit ({how})")
    return JobChoice(jobs, t, f"{jobs} jobs x {t} nvcc threads ({binding}): {said}; {what}",
                     jobs * unit_memory(profile, t), unit_seconds(profile, t),
                     predicted_seconds=seconds if makespan else None, order=unit_times(profile, host.cpus),
                     order_from=_order_from(profile))


def _fit(host: Resources, profile: JobProfile, budget: int, threads: int) -> int:
    p = max(1, min(threads, profile.arch_count))
    by_mem = budget // max(1, unit_memory(profile, threads))
    by_cpu = max(1, host.cpus // p)
    return int(min(by_mem, by_cpu))


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
    seconds, _, how = predict(profile, host.cpus, jobs, t, units=units)
    makespan = how.startswith(("LPT", "estimate"))
    said = f"predicted makespan {seconds:.0f} s ({how})" if makespan else f"predicted {seconds:.1f} s per unit ({how})"
    return JobChoice(jobs, t, f"{jobs} jobs x {t} nvcc threads (user override){warn}: {said}; {what}",
                     mem, unit_seconds(profile, t), predicted_seconds=seconds if makespan else None,
                     order=unit_times(profile, host.cpus), order_from=_order_from(profile))


def order_line(choice: JobChoice) -> str:
    """The build order, as ``kforge plan`` shows it."""
    if not choice.order:
        return "upstream's (no per-unit times measured yet for this project; this build measures them)"
    name, seconds = choice.order[0]
    if choice.order_from == "seed":
        return (f"longest first, through kforge's ninja shim, by the seed's {len(choice.order)} unit times (nothing "
                f"measured on this host yet; longest {name}, {seconds:.0f} s uncontended)")
    return (f"longest first, through kforge's ninja shim: {len(choice.order)} measured units "
            f"(longest {name}, {seconds:.0f} s uncontended)")
