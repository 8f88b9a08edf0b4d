"""Predict a build's wall time: longest-first list scheduling of measured unit times under the host's contention.

A compile unit runs slower when many run at once (memory bandwidth, SMT siblings, clocks): the
*contention factor* ``c(load)`` is a unit's time at ``load`` busy compile processes divided by its
time uncontended. It is a property of the host, kept in ``<cache>/jobs/host.json`` and learnt from
the unit times of earlier builds at different loads (:func:`learn`); until two loads were seen,
:func:`default_curve` is used.

The default curve (a documented guess from measurements, not a law) is the larger of two:

* **share of the cores**: no slowdown up to half the cores, then linear up to 1.73x at one process per
  core. flash-attn's sm_90 units on 16-core H200 hosts summed to 9,678 s at 8 jobs x 4 threads (upstream's
  default; one gencode, so 8 busy processes), and to 13,794 s (1.43x) and 16,702 s (1.73x) in two kforge
  builds at 16 jobs x 1 thread on hosts of the same kind. It takes the larger, with c(8) taken as 1.
* **busy compiles host-wide** (:data:`HOST_WIDE_POINTS`): on a 64-core H200 host (2026-11-27, issue 34) the
  same 73 units summed to 1.90x the seed's uncontended total at 32 busy processes (upstream's 32 x 4) and
  2.23x at 42 (kforge's 42 x 1), where the share-of-cores rule says 1.0 and 1.23x: the slowdown grows with
  the number of compiles, not only with the share of cores they take. **Flat beyond 42**: no build at 64 busy
  compiles on that host ran slower than 2.23x. Measured there: flash-attn's sm_80 units 2.16x the seed (20,876 s,
  2026-11-27 22:25; on the CPU machine the longest sm_80 unit took 426-437 s, its sm_90 build about 413 s), and the four-arch
  ``flash-attn-release`` at 32 x 2 (2026-11-28) 31,738 s of unit time, 1.93x the seed's four-arch times at two
  threads. An earlier version extrapolated +0.033 per compile beyond 42 (2.96x at 64) and predicted that build
  at 1,732 s against 1,091 s measured in ninja.

A host's own builds replace it (:func:`learn`).

:func:`simulate` is what ninja does once kforge's shim has ordered the edges (:mod:`kforge.build.ninjaorder`):
``jobs`` slots, units started longest first, each as soon as a slot frees. Every unit is charged
``c(jobs x processes per unit)`` for its whole run, also in the tail where fewer run (pessimistic
by a little at the end of a build).
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: 16-core H200 hosts: flash-attn sm_90 units at 16 jobs took 1.43x and 1.73x their time at 8 jobs (two builds).
DEFAULT_FULL_LOAD_FACTOR = 1.73
#: (busy compile processes, factor over the seed's uncontended unit times), flash-attn sm_90: 8 and 16 on
#: 16-core H200 hosts (2026-11-23), 32 and 42 on a 64-core H200 host (2026-11-27, docs/benchmarks/build-speed.md).
HOST_WIDE_POINTS: tuple[tuple[float, float], ...] = ((8.0, 1.0), (16.0, DEFAULT_FULL_LOAD_FACTOR), (32.0, 1.90),
                                                     (42.0, 2.23))
#: Units that must be common to two builds before their times say anything about contention.
MIN_COMMON_UNITS = 5


@dataclass(frozen=True)
class Contention:
    """``c(load)``: piecewise linear through ``points`` (load, factor), flat outside them."""

    points: tuple[tuple[float, float], ...]
    source: str

    def factor(self, load: float) -> float:
        pts = sorted(self.points)
        if not pts:
            return 1.0
        if load <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if load <= x1:
                return y0 + (y1 - y0) * (load - x0) / (x1 - x0) if x1 > x0 else y1
        return pts[-1][1]


def default_curve(cpus: int) -> Contention:
    """The documented guess for a host nothing was measured on (see the module docstring).

    Piecewise linear through one point per busy-process count from 1 to ``cpus``, each the larger of the
    share-of-cores rule and the host-wide points (flat beyond the last); flat beyond ``cpus`` (no more processes
    than cores run).
    """
    top = max(cpus, 2)
    half = max(1.0, cpus / 2)
    share = Contention(((half, 1.0), (float(top), DEFAULT_FULL_LOAD_FACTOR)), "")
    wide = Contention(HOST_WIDE_POINTS, "")
    points = tuple((float(n), round(max(share.factor(n), wide.factor(n)), 4)) for n in range(1, top + 1))
    return Contention(points,
                      f"default guess: the larger of 1.0 up to {half:g} busy processes and {DEFAULT_FULL_LOAD_FACTOR}x "
                      f"at {top} (share of the cores), and 1.0 at 8, 1.73x at 16, 1.90x at 32, 2.23x at 42 and beyond "
                      "busy processes (host-wide) (flash-attn on 16- and 64-core H200 hosts)")


def learn(builds: Sequence[tuple[float, Mapping[str, float]]], cpus: int) -> Contention | None:
    """A curve from earlier builds' unit times: ``builds`` = (load, {unit: seconds}) at one nvcc thread count.

    The lowest load seen is the reference, with the default curve's factor there (1.0 at up to half
    the cores); every other load's factor is that times the median ratio of the units both builds
    compiled. None when fewer than two loads (with :data:`MIN_COMMON_UNITS` common units) were seen.
    """
    by_load: dict[float, dict[str, float]] = {}
    for load, units in builds:
        by_load.setdefault(float(load), {}).update({k: float(v) for k, v in units.items() if v > 0})
    if len(by_load) < 2:
        return None
    loads = sorted(by_load)
    ref_load = loads[0]
    ref = by_load[ref_load]
    ref_factor = default_curve(cpus).factor(ref_load)
    points = [(ref_load, ref_factor)]
    for load in loads[1:]:
        common = [k for k in by_load[load] if k in ref]
        if len(common) < MIN_COMMON_UNITS:
            continue
        ratio = statistics.median(by_load[load][k] / ref[k] for k in common)
        points.append((load, ref_factor * ratio))
    if len(points) < 2:
        return None
    shown = ", ".join(f"{x:g}: {y:.2f}x" for x, y in points)
    return Contention(tuple(points), f"measured on this host ({shown})")


@dataclass(frozen=True)
class Slot:
    """One unit in a simulated schedule."""

    name: str
    lane: int
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    makespan: float
    busy: float  # sum of unit times as charged
    slots: tuple[Slot, ...]


def simulate(units: Sequence[tuple[str, float]], jobs: int) -> Schedule:
    """Longest-first list scheduling of (name, seconds) on ``jobs`` lanes (times already include contention)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    order = sorted(units, key=lambda u: -u[1])
    lanes = [(0.0, lane) for lane in range(jobs)]
    heapq.heapify(lanes)
    slots = []
    for name, seconds in order:
        start, lane = heapq.heappop(lanes)
        slots.append(Slot(name, lane, start, start + seconds))
        heapq.heappush(lanes, (start + seconds, lane))
    makespan = max((s.end for s in slots), default=0.0)
    return Schedule(makespan, sum(s for _, s in order), tuple(slots))


@dataclass(frozen=True)
class Cluster:
    """A distributed build as the simulation sees it: ``hosts`` build servers of ``jobs`` slots each."""

    hosts: int
    jobs: int  # compile slots per host
    per_unit_overhead: float = 0.0  # seconds a unit spends on the client and the wire (preprocess, send, receive)
    client_cpus: int = 0  # cores of the client doing that local part; 0: not a bottleneck
    setup_seconds: float = 0.0  # once per build (toolchain upload to every server)
    shared_host: bool = False  # every server on one host (benchmarks/dist_cluster.py): contention is c(hosts x jobs)


def simulate_cluster(units: Sequence[tuple[str, float]], cluster: Cluster, curve: Contention) -> Schedule:
    """LPT over ``hosts x jobs`` slots, each unit at its uncontended time x ``c(jobs)`` plus the per-unit overhead.

    With ``shared_host`` the servers share one host's memory system, and the curve is read at every busy compile
    of the host (``hosts x jobs``), as the curve is measured (host-wide).

    The client's local part is a second bound: ``sum(overhead) / client_cpus``. A simulation, not a
    measurement: the overheads are inputs (see benchmarks/simulate_distributed.py for the defaults).
    """
    if cluster.hosts < 1 or cluster.jobs < 1:
        raise ValueError(f"a cluster needs at least one host and one job, not {cluster.hosts} x {cluster.jobs}")
    factor = curve.factor(cluster.hosts * cluster.jobs if cluster.shared_host else cluster.jobs)
    schedule = simulate([(n, s * factor + cluster.per_unit_overhead) for n, s in units], cluster.hosts * cluster.jobs)
    client_bound = (len(units) * cluster.per_unit_overhead / cluster.client_cpus) if cluster.client_cpus else 0.0
    makespan = cluster.setup_seconds + max(schedule.makespan, client_bound)
    shifted = tuple(Slot(s.name, s.lane, s.start + cluster.setup_seconds, s.end + cluster.setup_seconds)
                    for s in schedule.slots)
    return Schedule(makespan, schedule.busy, shifted)
