"""Predict a build's wall time: longest-first list scheduling of measured unit times under the host's contention.

A compile unit runs slower when many run at once (memory bandwidth, SMT siblings, clocks): the
*contention factor* ``c(load)`` is a unit's time at ``load`` busy compile processes divided by its
time uncontended. It is a property of the host, kept in ``<cache>/jobs/host.json`` and learnt from
the unit times of earlier builds at different loads (:func:`learn`); until two loads were seen,
:func:`default_curve` is used.

The default curve (a documented guess from two measurements, not a law): no slowdown up to half the
cores, then linear up to 1.73x at one process per core. flash-attn's sm_90 units on 16-core H200 hosts
summed to 9,678 s at 8 jobs x 4 threads (upstream's default; one gencode, so 8 busy processes), and to
13,794 s (1.43x) and 16,702 s (1.73x) in two kforge builds at 16 jobs x 1 thread on hosts of the same
kind. The default takes the larger, with c(8) taken as 1; a host's own builds replace it (:func:`learn`).

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
    """The documented guess for a host nothing was measured on (see the module docstring)."""
    half = max(1.0, cpus / 2)
    return Contention(((half, 1.0), (float(max(cpus, 2)), DEFAULT_FULL_LOAD_FACTOR)),
                      f"default guess: 1.0 up to {half:g} busy processes, {DEFAULT_FULL_LOAD_FACTOR}x at {max(cpus, 2)} "
                      "(flash-attn sm_90 on an H200 host, 16 vs 8 jobs)")


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


def simulate_cluster(units: Sequence[tuple[str, float]], cluster: Cluster, curve: Contention) -> Schedule:
    """LPT over ``hosts x jobs`` slots, each unit at its uncontended time x ``c(jobs)`` plus the per-unit overhead.

    The client's local part is a second bound: ``sum(overhead) / client_cpus``. A simulation, not a
    measurement: the overheads are inputs (see benchmarks/simulate_distributed.py for the defaults).
    """
    if cluster.hosts < 1 or cluster.jobs < 1:
        raise ValueError(f"a cluster needs at least one host and one job, not {cluster.hosts} x {cluster.jobs}")
    factor = curve.factor(cluster.jobs)
    schedule = simulate([(n, s * factor + cluster.per_unit_overhead) for n, s in units], cluster.hosts * cluster.jobs)
    client_bound = (len(units) * cluster.per_unit_overhead / cluster.client_cpus) if cluster.client_cpus else 0.0
    makespan = cluster.setup_seconds + max(schedule.makespan, client_bound)
    shifted = tuple(Slot(s.name, s.lane, s.start + cluster.setup_seconds, s.end + cluster.setup_seconds)
                    for s in schedule.slots)
    return Schedule(makespan, schedule.busy, shifted)
