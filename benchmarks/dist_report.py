"""The scaling table of sccache-dist cluster builds (issue 34, item 2): each run measured, beside the model's predictions.

Reads the run folders ``benchmarks/dist_cluster.py`` wrote (``dist<N>x<C>-<n>/``: result.json, cluster.json,
dist-jobs.json, compare.json) and, with ``--local``, the local build's result.json the cluster builds are held against.
For each run it prints one Markdown row: servers x cores, the client's jobs and whether the plan cut the units, the
whole build and ninja, the steps compiled on the servers and the distribution errors, whether the cubins matched the
local build's, the units' measured time outside the servers' compilers, and two PREDICTIONS of ninja's time by
:func:`kforge.build.makespan.simulate_cluster` (all servers on one host: contention at every busy compile): one with the
guessed 3 s a unit written before the runs, one with that run's measured overhead. Predictions are labelled as such.

    python3 benchmarks/dist_report.py --local bench/kforge-1/result.json bench/dist4x16-1 bench/dist2x16-1 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from simulate_distributed import cut, seed_units  # noqa: E402

from kforge.build.makespan import Cluster, default_curve, simulate_cluster  # noqa: E402

GUESS = 3.0  # seconds a unit outside the servers, the guess the predictions in docs/distributed.md were made with
SETUP = 5.0


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def row(run: Path, host_cpus: int, local_wall: float | None) -> str:
    result, cluster = _load(run / "result.json"), _load(run / "cluster.json")
    jobs_file, cmp = _load(run / "dist-jobs.json"), _load(run / "compare.json")
    servers, cores = cluster.get("servers", 0), cluster.get("cpus_per_server", 0)
    split = str(result.get("split") or "").split(":")[0].endswith("=1")
    units = cut(seed_units()) if split else seed_units()
    outside = (jobs_file.get("units") or {}).get("outside_compile") or {}
    measured = outside["sum"] / outside["n"] if outside.get("n") else None
    curve = default_curve(host_cpus)

    client_cpus = len(cluster.get("client_cpus") or []) or host_cpus  # pinned, or the whole host

    def predict(overhead: float) -> float:
        return simulate_cluster(units, Cluster(servers, cores, overhead, client_cpus, SETUP, shared_host=True),
                                curve).makespan

    sc = result.get("sccache") or {}
    remote = sum((sc.get("dist_compiles") or {}).values())
    wall = result.get("wall_seconds")
    ratio = f"{wall / local_wall:.2f}x" if wall and local_wall else "-"
    same = ("yes" if cmp.get("cubins_identical") else f"no ({len(cmp.get('differ') or [])} differ)") if cmp else "-"
    return (f"| {servers} x {cores} | {cluster.get('client_max_jobs')} {'cut' if split else 'whole'} "
            f"({result.get('units')} units) | {wall} s ({ratio}) | {result.get('ninja_wall_seconds')} s | {remote} / "
            f"{sc.get('dist_errors')} | {same} | {f'{measured:.1f} s' if measured is not None else '-'} | "
            f"{predict(GUESS):.0f} s | {f'{predict(measured):.0f} s' if measured is not None else '-'} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="dist<N>x<C>-<n> folders")
    ap.add_argument("--local", type=Path, help="the local build's result.json (its wall time is the ratio's base)")
    ap.add_argument("--host-cpus", type=int, default=64, help="the host's cores, for the default contention curve")
    args = ap.parse_args(argv)
    local_wall = _load(args.local).get("wall_seconds") if args.local else None
    print("| servers x cores | client jobs, units | whole build (x local) | ninja | steps on servers / dist. errors "
          "| cubins = local | unit time outside servers (mean, measured) | PREDICTED ninja, 3 s guess "
          "| PREDICTED ninja, measured overhead |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        print(row(run, args.host_cpus, local_wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
