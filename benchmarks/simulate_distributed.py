"""SIMULATION (not a measurement): flash-attn's build distributed with sccache-dist over N hosts, from unit times.

What it takes:

* unit times: ``--report report.json`` (a build report, from ``kforge build`` or ``benchmarks/build_full.py``:
  the measured seconds of every unit), divided by the contention factor of the job count it ran at
  (``--measured-at-jobs``, with the default curve of :mod:`kforge.build.makespan` or ``--host-json``);
  without a report, flash-attn's seed from ``kforge.build.profiles.SEEDS`` (the unit times of one H200 build);
* the cluster: ``--hosts`` build servers of ``--jobs`` slots each, every unit slowed by ``c(jobs)``;
* overheads, which are GUESSES unless you measured them: ``--overhead`` seconds per unit on the client
  and the wire (default 3 s: ``nvcc -E`` of one flash-attn unit took 2.4 s on a 2-core machine, plus
  sending the preprocessed source to the servers), ``--client-cpus`` (the client does that part),
  ``--setup`` once per build (default 5 s: the nvcc toolchains sccache uploads to each server were
  111 MB on the loopback test, ~1 s at 1 Gb/s).

It prints a table labelled as a simulation, per host count: predicted wall time and speed-up over one
host. Example::

    PYTHONPATH=src python3 benchmarks/simulate_distributed.py --report out/kforge-1/report.json \\
        --measured-at-jobs 16 --hosts 1 2 4 8 --jobs 16 --client-cpus 16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kforge.build import makespan, profiles, unitsplit  # noqa: E402
from kforge.build.makespan import Cluster, Contention, default_curve, simulate_cluster  # noqa: E402


def unit_times(args: argparse.Namespace, curve: Contention) -> tuple[list[tuple[str, float]], str]:
    if args.report:
        data = json.loads(Path(args.report).read_text())
        factor = curve.factor(args.measured_at_jobs)
        units = [(Path(u["output"]).name, float(u["seconds"]) / factor) for u in data["units"]]
        return units, (f"measured: {len(units)} units of {args.report}, divided by c({args.measured_at_jobs}) = "
                       f"{factor:.2f}")
    return seed_units(), ("flash-attn's seed (kforge.build.profiles.SEEDS): the 73 unit times of one H200 build at 16 "
                          "jobs, divided by the default c(16)")


def seed_units() -> list[tuple[str, float]]:
    """flash-attn's 73 seed unit times (uncontended seconds), one entry a unit."""
    seed = profiles.SEEDS["flash-attn"]
    return [(glob if n == 1 else f"{glob}#{i}", seconds) for glob, seconds, n in seed.seed_units for i in range(n)]


def cut(units: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The cut build's units: flash-attn's forge.toml unit_split applied (patch 0005)."""
    from kforge.config.forge import load_forge

    rule = load_forge(Path(__file__).resolve().parents[1]).projects["flash-attn"].unit_split
    assert rule is not None
    return list(unitsplit.cut(units, rule))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", help="a build report.json with measured unit times")
    ap.add_argument("--measured-at-jobs", type=int, default=16, help="the job count the report's units ran at")
    ap.add_argument("--host-json", help="a measured contention curve (<cache>/jobs/host.json)")
    ap.add_argument("--cpus", type=int, default=16, help="cores per host, for the default contention curve")
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--jobs", type=int, default=16, help="compile slots per host")
    ap.add_argument("--overhead", type=float, default=3.0, help="seconds per unit on the client and the wire (guess)")
    ap.add_argument("--client-cpus", type=int, default=16)
    ap.add_argument("--setup", type=float, default=5.0, help="seconds once per build (toolchain upload; guess)")
    ap.add_argument("--shared-host", action="store_true",
                    help="every server on one host (benchmarks/dist_cluster.py): contention at hosts x jobs busy")
    ap.add_argument("--measured-jobs", help="a dist-jobs.json from benchmarks/dist_cluster.py: the per-unit "
                    "overhead is its units' mean time outside the servers' compilers (measured, not guessed)")
    ap.add_argument("--split-units", action="store_true",
                    help="the cut build: flash-attn's forge.toml unit_split applied to the unit times (patch 0005)")
    args = ap.parse_args(argv)
    if args.host_json:
        d = json.loads(Path(args.host_json).read_text())
        curve = Contention(tuple((float(x), float(y)) for x, y in d["points"]), d.get("source", args.host_json))
    else:
        curve = default_curve(args.cpus)
    units, source = unit_times(args, curve)
    overhead_source = "a guess"
    if args.measured_jobs:
        outside = json.loads(Path(args.measured_jobs).read_text())["units"]["outside_compile"]
        args.overhead = outside["sum"] / outside["n"]
        overhead_source = f"measured: the mean of {outside['n']} units in {args.measured_jobs}"
    if args.split_units:
        units = cut(units)
        source += f"; cut by forge.toml's unit_split into {len(units)} units"
    local = makespan.simulate(units, args.jobs).makespan * curve.factor(args.jobs)
    print(f"SIMULATION, not a measurement. Units: {source}. Contention: {curve.source}.")
    print(f"Overheads (inputs): {args.overhead:.2f} s per unit ({overhead_source}), {args.client_cpus} client cores, "
          f"{args.setup:g} s setup." + (" All servers on one host: contention at hosts x jobs busy compiles."
                                        if args.shared_host else ""))
    print(f"One host, no distribution, {args.jobs} jobs: {local:.0f} s (longest first).\n")
    print("| hosts | slots | simulated wall (s) | x one host |")
    print("|---:|---:|---:|---:|")
    for n in args.hosts:
        sim = simulate_cluster(units, Cluster(n, args.jobs, args.overhead, args.client_cpus, args.setup,
                                              args.shared_host), curve)
        print(f"| {n} | {n * args.jobs} | {sim.makespan:.0f} | {local / sim.makespan:.2f} |")
    longest = max(s for _, s in units) * curve.factor(args.jobs)
    print(f"\nFloor: the longest unit alone takes {longest:.0f} s at c({args.jobs}); no host count goes below it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
