"""Build parallelism from measurements: ``MAX_JOBS`` and ``NVCC_THREADS`` for the shortest predicted build that fits.

Every upstream guesses a GB-per-job constant (2.8, 3, 5, 8, 9) and either runs out of
memory or leaves cores idle. kforge instead keeps a small per-project profile of the
peak RSS and the time of every compile unit (``<cache>/jobs/<project>.json``), updated after
every build (:mod:`kforge.build.profiles`), and sizes the build from the memory that is *available now*.

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
  a single-arch unit and ``s`` the arch-independent share (host pass; default 0.3). A seed prices
  ``a`` per arch (:attr:`kforge.build.profiles.JobProfile.arch_weights`: flash-attn's sm_100 and sm_120
  device passes cost 0.57 and 0.63 of sm_90's, from measured unit sums), so ``a`` is the archs' summed weight there.
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

import re
from dataclasses import dataclass, field, replace

from kforge.build.host import Resources
from kforge.build.makespan import Contention, Schedule, default_curve, simulate
from kforge.build.profiles import GB, GiB, JobProfile, thread_factor
from kforge.errors import BuildError

#: Candidates whose predicted makespan is within this share of the best count as equal: fewer processes win.
TIE = 0.005


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
    order_from: str = ""  # "measured" (this host's earlier builds), "seed" (kforge.build.profiles.SEEDS), "" (no order)
    split_line: str = ""  # the plan's unit-split decision (kforge.build.unitsplit), "" when the project has none
    split_env: tuple[tuple[str, str], ...] = ()  # the variable that carries it to the project's build

    def env(self) -> dict[str, str]:
        """``MAX_JOBS``, ``CMAKE_BUILD_PARALLEL_LEVEL`` and every thread variable, as the build sees them."""
        out = {"MAX_JOBS": str(self.max_jobs), "CMAKE_BUILD_PARALLEL_LEVEL": str(self.max_jobs)}
        out.update({var: str(self.nvcc_threads) for var in self.thread_vars})
        out.update(self.split_env)
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
    return profile.unit_seconds * thread_factor(profile, threads)


def headroom(host: Resources) -> int:
    return max(2 * GiB, host.mem_available // 10)


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
        div = curve.factor(load) * thread_factor(profile, threads)
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
    # The seed's unit times describe one build of its own unit count; a build of another count (another
    # profile of the project) is estimated from its count instead.
    if profile.seed_units and units in (None, sum(n for _, _, n in profile.seed_units)):
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
            units: int | None = None, overhead: float = 0.0) -> tuple[float, Schedule | None, str]:
    """(predicted seconds, the simulated schedule if per-unit times exist, how it was predicted) for ``jobs`` x ``threads``.

    Without per-unit times or a unit count the number is seconds per unit at steady state, not a makespan.
    ``overhead`` is added to every unit, uncontended (a cluster's client steps and the wire: :mod:`distplan`).
    """
    curve = contention(profile, cpus)
    p = max(1, min(threads, profile.arch_count))
    scale = thread_factor(profile, threads) * curve.factor(jobs * p)
    work = _work(profile, cpus, units)
    if work.units:
        schedule = simulate([(k, v * scale + overhead) for k, v in work.units], jobs)
        return schedule.makespan, schedule, work.how
    t_unit = profile.unit_seconds * scale + overhead
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
    candidates: list[tuple[float, int, int, int, str, Schedule | None]] = []
    for t in range(1, max(1, profile.arch_count) + 1):
        p = max(1, min(t, profile.arch_count))
        for jobs in range(1, _fit(host, profile, budget, t) + 1):
            seconds, schedule, how = predict(profile, host.cpus, jobs, t, units=units, overhead=host.unit_overhead)
            candidates.append((seconds, jobs * p, jobs, t, how, schedule))
    if not candidates:  # not even one single-thread unit fits: run one and say so
        need = unit_memory(profile, 1)
        return JobChoice(1, 1, f"1 job, 1 nvcc thread: one unit needs {need / GB:.1f} GB but only "
                         f"{budget / GB:.1f} GB is free after headroom; it may be OOM-killed; {what}",
                         need, unit_seconds(profile, 1))
    best = min(c[0] for c in candidates)
    seconds, _, jobs, t, how, schedule = min((c for c in candidates if c[0] <= best * (1 + TIE) + 1e-9),
                                   key=lambda c: (c[1], c[2], c[0]))
    p = max(1, min(t, profile.arch_count))
    fit = _fit(host, profile, budget, t)
    binding = ("cpus-bound" if jobs == max(1, host.cpus // p) else "memory-bound" if jobs == fit
               else "more jobs predicted no faster")
    if binding != "cpus-bound" and schedule is not None and schedule.slots:
        longest = max(schedule.slots, key=lambda s: s.end - s.start)
        if schedule.makespan <= (longest.end - longest.start) * 1.05:  # the build is one unit long: the floor
            binding = (f"bound by its longest unit, {longest.name.split('#')[0]} at {longest.end - longest.start:.0f} s with "
                       f"{jobs * p} busy compiles; more jobs do not shorten it")
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
    seconds, _, how = predict(profile, host.cpus, jobs, t, units=units, overhead=host.unit_overhead)
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


def jobs_sentence(choice: JobChoice) -> str:
    """The job choice in one short sentence (``kforge -v plan`` shows the model's details)."""
    head = re.match(r"^\d+ jobs? x \d+ nvcc threads? \([^)]*\)", choice.reason)
    said = head.group(0) if head else choice.reason.split(":", 1)[0]
    if choice.predicted_seconds is not None:
        said += f", about {max(1, round(choice.predicted_seconds / 60))} min predicted"
    if "WARNING" in choice.reason:
        said += "; WARNING: it may not fit in memory"
    return said + " (kforge -v plan: why)"
