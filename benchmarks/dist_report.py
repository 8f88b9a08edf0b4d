"""The scaling table of sccache-dist cluster builds (issue 34, item 2): each run measured, beside the model's predictions.

Reads the run folders ``benchmarks/dist_cluster.py`` wrote (``dist<N>x<C>-<n>/``: result.json, cluster.json,
dist-jobs.json, sccache-client.log) and, with ``--local``, the local build's result.json the cluster builds are held
against. For each run it prints one Markdown row: servers x cores, the client's jobs and whether the plan cut the units,
the whole build and ninja, the steps compiled on the servers and the distribution errors, how many cubins are
byte-identical to one of the local build's (by content: a build that cut fewer units has cubins the other has not),
the units' measured time outside the servers' compilers, and two PREDICTIONS of ninja's time by
:func:`kforge.build.makespan.simulate_cluster` (all servers on one host: contention at every busy compile): one with the
guessed 3 s a unit written before the runs, one with that run's measured overhead. Predictions are labelled as such,
and made for flash-attn targets only (the model's unit times are flash-attn's seed).

A run that was stopped before it finished (no result.json: the lease ended) gets a row from its plan.json and its client
log: the units done and when it stopped, a lower bound. With ``--extrapolate-from RUN`` (a finished run of the same
units) the row adds an EXTRAPOLATION, labelled as one: the stop time plus the unfinished units' compile time in that run,
less what each in-flight unit had already run, over the stopped run's slots.

    python3 benchmarks/dist_report.py --local bench/kforge-1/result.json bench/dist4x16-1 bench/dist2x16-1 ...
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from simulate_distributed import cut, seed_units  # noqa: E402

from kforge.build import distlog  # noqa: E402
from kforge.build.makespan import Cluster, default_curve, simulate_cluster  # noqa: E402

GUESS = 3.0  # seconds a unit outside the servers, the guess the predictions in docs/distributed.md were made with
SETUP = 5.0
HEADER = ("| servers x cores | client jobs, units | whole build (x local) | ninja | steps on servers / dist. errors "
          "| cubins = a local one | unit time outside servers (mean, measured) | PREDICTED ninja, 3 s guess "
          "| PREDICTED ninja, measured overhead |\n|---|---|---|---|---|---|---|---|---|")


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def cubins_same(local: dict, result: dict) -> str:
    """How many of this build's cubins are byte-identical to one of the local build's ("-" without both lists)."""
    a = (local.get("binaries") or {}).get("cubins") or {}
    b = (result.get("binaries") or {}).get("cubins") or {}
    if not a or not b:
        return "-"
    if a == b:
        return f"all {len(b)}, by name too"
    matched = sum((Counter(a.values()) & Counter(b.values())).values())
    return f"{matched} of {len(b)}"


def _cut(split_line: object) -> bool:
    """Whether a plan's split line (``FLASH_ATTN_KFORGE_SPLIT_UNITS=1: ...``) says the units were cut."""
    return str(split_line or "").split(":")[0].endswith("=1")


def _stop(client: list[distlog.ClientJob]) -> float:
    """Seconds from the client's first request to its last logged event (0 with no job)."""
    if not client:
        return 0.0
    return max(j.fetched or j.running or j.requested for j in client) - min(j.requested for j in client)


def _shape(run: Path, cluster: dict) -> tuple[int, int]:
    if cluster.get("servers"):
        return int(cluster["servers"]), int(cluster["cpus_per_server"])
    m = re.match(r"dist(\d+)x(\d+)", run.name)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def extrapolate(client: list[distlog.ClientJob], reference: dict, slots: int) -> float | None:
    """EXTRAPOLATION for a stopped run: its stop plus the unfinished units' server compile time in ``reference`` (a
    finished run's dist-jobs.json), less what each in-flight unit had run by the stop, over ``slots``."""
    per_unit: dict[str, float] = {}
    for j in reference.get("job_list") or []:
        per_unit[j["unit"]] = per_unit.get(j["unit"], 0.0) + (j.get("compile") or 0.0)
    if not client or not per_unit or slots <= 0:
        return None
    first, stop = min(j.requested for j in client), _stop(client)
    done = distlog.finished_units(client)
    started: dict[str, float] = {}
    for j in client:
        started.setdefault(j.unit, j.requested - first)
    left = sum(max(0.0, s - (stop - started[u] if u in started else 0.0)) for u, s in per_unit.items() if u not in done)
    return stop + left / slots


def stopped_row(run: Path, servers: int, cores: int, reference: dict | None) -> tuple[str, str, str]:
    """Cells of a run with no result.json: (client jobs and units, whole build, ninja), from plan.json and the log."""
    jobs = _load(run / "plan.json").get("jobs") or {}
    log = run / "sccache-client.log"
    client = distlog.client_jobs(log.read_text(errors="replace")) if log.is_file() else []
    done = distlog.finished_units(client)
    total = len({j["unit"] for j in (reference or {}).get("job_list") or []}) or len(jobs.get("order") or [])
    split = _cut(jobs.get("split"))
    ninja = f"> {_stop(client):.0f} s (stopped: {len(done)} of {total} units done)"
    guess = extrapolate(client, reference, servers * cores) if reference else None
    if guess is not None:
        ninja += f"; EXTRAPOLATED ≈ {guess:.0f} s"
    return f"{jobs.get('max_jobs')} {'cut' if split else 'whole'}", "stopped", ninja


def _target(result: dict, plan: dict) -> str:
    """The run's target: plan.json's, else the one in result.json's kforge command line."""
    if plan.get("target"):
        return str(plan["target"])
    words = str(result.get("command") or "").split()
    return words[words.index("build") + 1] if "build" in words[:-1] else ""


def row(run: Path, host_cpus: int, local: dict | None, reference: dict | None = None) -> str:
    result, cluster = _load(run / "result.json"), _load(run / "cluster.json")
    seeded = _target(result, _load(run / "plan.json")).startswith("flash-attn-")  # the model has flash-attn's seed
    jobs_file = _load(run / "dist-jobs.json")
    servers, cores = _shape(run, cluster)
    outside = (jobs_file.get("units") or {}).get("outside_compile") or {}
    measured = outside["sum"] / outside["n"] if outside.get("n") else None
    client_cpus = len(cluster.get("client_cpus") or []) or host_cpus  # pinned, or the whole host
    sc = result.get("sccache") or {}
    if result:
        split = _cut(result.get("split"))
        wall, local_wall = result.get("wall_seconds"), (local or {}).get("wall_seconds")
        who = f"{cluster.get('client_max_jobs')} {'cut' if split else 'whole'} ({result.get('units')} units)"
        whole = f"{wall} s ({f'{wall / local_wall:.2f}x' if wall and local_wall else '-'})"
        ninja = f"{result.get('ninja_wall_seconds')} s"
        steps = f"{sum((sc.get('dist_compiles') or {}).values())} / {sc.get('dist_errors')}"
    else:
        who, whole, ninja = stopped_row(run, servers, cores, reference)
        split = who.endswith("cut")
        steps = "-"
    units = cut(seed_units()) if split else seed_units()
    curve = default_curve(host_cpus)

    def predict(overhead: float) -> float:
        return simulate_cluster(units, Cluster(servers, cores, overhead, client_cpus, SETUP, shared_host=True),
                                curve).makespan

    guessed = f"{predict(GUESS):.0f} s" if seeded else "- (no seed for this target)"
    return (f"| {servers} x {cores} | {who} | {whole} | {ninja} | {steps} | {cubins_same(local or {}, result)} | "
            f"{f'{measured:.1f} s' if measured is not None else '-'} | {guessed} | "
            f"{f'{predict(measured):.0f} s' if measured is not None and seeded else '-'} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="dist<N>x<C>-<n> folders")
    ap.add_argument("--local", type=Path, help="the local build's result.json (its wall time is the ratio's base)")
    ap.add_argument("--host-cpus", type=int, default=64, help="the host's cores, for the default contention curve")
    ap.add_argument("--extrapolate-from", type=Path,
                    help="a finished run folder of the same units: a stopped run's finish is extrapolated from it")
    args = ap.parse_args(argv)
    local = _load(args.local) if args.local else None
    reference = _load(args.extrapolate_from / "dist-jobs.json") if args.extrapolate_from else None
    print(HEADER)
    for run in args.runs:
        print(row(run, args.host_cpus, local, reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
