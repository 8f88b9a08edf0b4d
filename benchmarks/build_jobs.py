"""Benchmark: kforge's job choice against flash-attn's default MAX_JOBS formula, same host, same run.

Run on the GPU host (it needs torch, nvcc and ninja; it builds nothing on the GPU itself)::

    PYTHONPATH=src python3 benchmarks/build_jobs.py --sdist .carry/fa2/flash_attn-2.8.3.post2.tar.gz \
        --debs .carry/fa2 --out "$OUT"

What it does, in order:

1. Verifies the pinned sdist's sha256 and unpacks it.
2. Runs flash-attn's own ``setup.py build_ext`` (FLASH_ATTN_CUDA_ARCHS=90) with a stand-in
   ``ninja`` that saves the ``build.ninja`` torch's BuildExtension wrote and stops: the
   compile commands below are exactly torch's, flags and include dirs included.
3. Compiles the same sample of compile units twice with real ninja and nvcc:
   (a) upstream's default: MAX_JOBS = max(1, min(cpu // 2, int(available_GiB / 9))), NVCC_THREADS=4;
   (b) kforge: ``choose_jobs(detect_resources(), load_profile(..., "flash-attn", 1))``, with the
   compiler cache from ``compiler_cache()`` (so (b) pays ccache's cold-miss overhead).
   Every compile runs under ``python -m kforge.build.measure measure`` (time and peak RSS per unit);
   the system's used memory is sampled every 0.5 s.
4. Rebuilds (b) from an empty object dir with the warm compiler cache.
5. Writes results.json, the two timelines, and prints a summary.

Extrapolation to the full 73-unit build: UPSTREAM_FACTS gives a longest-first schedule of the
real unit times (1225 s for 8 jobs, 818 s for 12, 645 s for 16) measured one build at 8 jobs.
Running more jobs at once slows each unit (shared cores, memory bandwidth); this run measures
that slowdown on the same units (``contention`` = median of per-unit time under (b) over (a)),
and the estimate is ``LPT(jobs) * contention``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kforge.build import jobs, measure, profiles, report, toolchain
from kforge.build import run as buildrun
from kforge.build.host import detect_resources

SRC = str(Path(__file__).resolve().parents[1] / "src")

SDIST_SHA256 = "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"
SAMPLE = (
    [f"flash_fwd_hdim{h}_{t}_sm80" for h in (32, 64, 96, 128) for t in ("fp16", "bf16")]
    + [f"flash_fwd_hdim{h}_{t}_causal_sm80" for h in (32, 64) for t in ("fp16", "bf16")]
    + [f"flash_bwd_hdim{h}_{t}_sm80" for h in (32, 64) for t in ("fp16", "bf16")]
)
#: From UPSTREAM_FACTS: longest-first schedules of the measured 73 unit times (sm_90, 2.8.3.post2).
FACTS_LPT = {8: 1225.0, 12: 818.0, 16: 645.0}
FACTS_REAL_8 = 1307.0

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v.split()[0]) * 1024
    return out


class MemSampler(threading.Thread):
    """Peak of MemTotal - MemAvailable while running."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.base = self._used()
        self._halt = threading.Event()

    @staticmethod
    def _used() -> int:
        m = meminfo()
        return m["MemTotal"] - m["MemAvailable"]

    def run(self) -> None:
        while not self._halt.wait(0.5):
            self.peak = max(self.peak, self._used())

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return self.peak


def upstream_choice() -> tuple[int, int, float]:
    """flash-attn 2.8.3's NinjaBuildExtension formula, with psutil as it uses it."""
    try:
        import psutil

        free_gb = psutil.virtual_memory().available / 1024**3
    except ImportError:
        free_gb = meminfo()["MemAvailable"] / 1024**3
    return max(1, min(max(1, (os.cpu_count() or 2) // 2), int(free_gb / 9))), 4, free_gb


def capture_build_ninja(src: Path, work: Path, nvcc: toolchain.Nvcc) -> str:
    fake = work / "fake-ninja"
    fake.mkdir(exist_ok=True)
    captured = work / "captured.ninja"
    (fake / "ninja").write_text(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 1.11.1; exit 0; fi\n"
        f"cp build.ninja '{captured}'; echo 'kforge-bench: captured build.ninja'; exit 1\n"
    )
    (fake / "ninja").chmod(0o755)
    env = {**os.environ, **nvcc.env(), "PATH": f"{fake}:{os.environ['PATH']}", "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
           "FLASH_ATTN_CUDA_ARCHS": "90", "MAX_JOBS": "1", "NVCC_THREADS": "4"}
    env.pop("PYTORCH_NVCC", None)
    out = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=src, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    if not captured.is_file():
        print(out.stdout[-3000:], out.stderr[-3000:])
        raise SystemExit("could not capture torch's build.ninja")
    return captured.read_text()


def make_variant(text: str, vdir: Path, units: list[str], threads: int, nvcc: str | None) -> list[str]:
    """Rewrite torch's build.ninja for one variant; return the sample's object paths."""
    builds = re.findall(r"^build (\S+): cuda_compile (\S+)$", text, flags=re.MULTILINE)
    objdir = os.path.commonpath([os.path.dirname(o) for o, _ in builds])
    objdir = objdir[: objdir.index("/csrc")] if "/csrc" in objdir else objdir
    text = text.replace(objdir, str(vdir / "obj"))
    text = re.sub(r"--threads\s+\d+", f"--threads {threads}", text)
    measure = f"{sys.executable} -m kforge.build.measure measure --log {vdir / 'units.jsonl'} --threads {threads} --output $out --"
    text = re.sub(r"^(\s+command = )\$nvcc ", rf"\1{measure} $nvcc ", text, flags=re.MULTILINE)
    if nvcc:
        text = re.sub(r"^nvcc = .*$", f"nvcc = {nvcc}", text, flags=re.MULTILINE)
    else:  # newer torch prefixes "ccache " itself when ccache is on PATH; the baseline runs without
        text = re.sub(r"^nvcc = (?:\S*ccache|sccache) ", "nvcc = ", text, flags=re.MULTILINE)
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "build.ninja").write_text(text)
    wanted = []
    for obj, src in re.findall(r"^build (\S+): cuda_compile (\S+)$", text, flags=re.MULTILINE):
        if Path(src).stem in units:
            wanted.append(obj)
    missing = set(units) - {Path(o).stem for o in wanted}
    if missing:
        raise SystemExit(f"units not in build.ninja: {sorted(missing)}")
    return wanted


def run_ninja(vdir: Path, targets: list[str], njobs: int, env: dict[str, str], timeout: float) -> dict:
    sampler = MemSampler()
    sampler.start()
    start = time.monotonic()
    progress = report.NinjaProgress()
    proc = subprocess.Popen([shutil.which("ninja", path=env["PATH"]) or "ninja", "-C", str(vdir), "-j", str(njobs),
                             *targets], env={**env, "PYTHONPATH": SRC},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines: list[str] = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    assert proc.stdout
    for line in proc.stdout:
        lines.append(line)
        st = progress.feed(line)
        if st:
            eta = "?" if st.eta is None else f"{st.eta:.0f}s"
            log(f"  [{st.done}/{st.total}] elapsed {st.elapsed:.0f}s eta {eta}")
    rc = proc.wait()
    timer.cancel()
    wall = time.monotonic() - start
    peak = sampler.stop()
    text = "".join(lines)
    return {"rc": rc, "wall_s": wall, "sys_used_peak": peak, "sys_used_base": sampler.base,
            "oom": rc != 0 and buildrun.looks_oom(rc, text), "timed_out": rc == -9 and wall >= timeout - 1,
            "tail": text[-1500:] if rc else ""}


def summarize(vdir: Path, title: str) -> dict:
    measures = {m.output: m for m in measure.read_measures(vdir / "units.jsonl")}
    entries = report.parse_ninja_log(vdir / ".ninja_log")
    rep = report.build_report(entries, {k: m.peak_rss for k, m in measures.items()}, title=title)
    report.write_report(rep, vdir)
    return {
        "units": {Path(u.output).stem: {"seconds": u.seconds, "peak_rss": u.peak_rss} for u in rep.units},
        "max_parallel": rep.max_parallel,
        "busy_s": rep.busy_seconds,
        "unit_peak_rss_max": rep.peak_rss_max,
        "failed_units": [m.output for m in measures.values() if m.returncode != 0],
    }


def setup_ccache(debs: Path | None, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    if shutil.which("ccache") is None and debs and any(debs.glob("*.deb")):
        root = work / "ccache-root"
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        env["PATH"] = f"{root / 'usr/bin'}:{env['PATH']}"
        env["LD_LIBRARY_PATH"] = f"{root / 'usr/lib/x86_64-linux-gnu'}:{env.get('LD_LIBRARY_PATH', '')}"
    env["CCACHE_DIR"] = str(work / "ccache")
    env["CCACHE_MAXSIZE"] = "20G"
    return env


def ccache_stats(env: dict[str, str]) -> str:
    out = subprocess.run(["ccache", "-s"], env=env, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdist", type=Path, default=None)
    ap.add_argument("--captured", type=Path, default=None,
                    help="rehearsal: use this torch-style build.ninja instead of running the sdist's setup.py")
    ap.add_argument("--debs", type=Path, default=None, help="folder with ccache .deb files (host without ccache)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kforge-build-jobs"))
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--deadline", type=float, default=570.0, help="seconds for the whole run")
    ap.add_argument("--units", nargs="*", default=SAMPLE)
    ap.add_argument("--no-cache", action="store_true", help="run (b) without the compiler cache (a control)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="skip (a) and compare with the upstream run in this earlier results.json (cross-run)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"sample": args.units}

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))

    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    if not args.captured:
        digest = sha256(args.sdist)
        if digest != SDIST_SHA256:
            raise SystemExit(f"sdist sha256 {digest} != pinned {SDIST_SHA256}")
        results["sdist_sha256"] = digest
        with tarfile.open(args.sdist) as tar:
            tar.extractall(args.work, filter="data")
        src = next(args.work.glob("flash_attn-*"))
    host = detect_resources()
    nvcc = toolchain.find_nvcc(os.environ)
    torch_info = toolchain.detect_torch(sys.executable)
    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "?")
    results["host"] = {"cpus": host.cpus, "mem_available": host.mem_available, "mem_total": host.mem_total,
                       "mem_source": host.source, "cpu_model": cpu_model, "nvcc": str(nvcc.version),
                       "torch": f"{torch_info.version}+{torch_info.local}" if torch_info else None,
                       "python": sys.version.split()[0]}
    log(f"host: {host.describe()}; {cpu_model}; nvcc {nvcc.version}; torch {results['host']['torch']}")

    text = args.captured.read_text() if args.captured else capture_build_ninja(src, args.work, nvcc)
    log("captured torch's build.ninja: " + re.search(r"^nvcc = .*$", text, re.MULTILINE).group(0))
    results["cuda_post_cflags"] = (re.search(r"^cuda_post_cflags = (.*)$", text, re.MULTILINE) or [None, None])[1]
    results["torch_nvcc_line"] = (re.search(r"^nvcc = (.*)$", text, re.MULTILINE) or [None, None])[1]
    results["torch_cuda_rule"] = (re.search(r"^rule cuda_compile\n(?:  .*\n)*", text, re.MULTILINE) or [None])[0]
    log("torch's cuda_compile rule:\n" + str(results["torch_cuda_rule"]))

    up_jobs, up_threads, free_gb = upstream_choice()
    cache = args.work / "kforge-cache"
    profile = profiles.load_profile(cache, "flash-attn", 1)
    choice = jobs.choose_jobs(host, profile, units=len(args.units))
    results["upstream_choice"] = {"max_jobs": up_jobs, "nvcc_threads": up_threads, "free_gib": free_gb}
    results["kforge_choice"] = {"max_jobs": choice.max_jobs, "nvcc_threads": choice.nvcc_threads,
                                "reason": choice.reason, "est_peak_memory": choice.est_peak_memory}
    log(f"upstream: MAX_JOBS={up_jobs} NVCC_THREADS={up_threads} (free {free_gb:.1f} GiB)")
    log(f"kforge:   MAX_JOBS={choice.max_jobs} NVCC_THREADS={choice.nvcc_threads}: {choice.reason}")
    save()

    env_cc = setup_ccache(args.debs, args.work)
    cc = None if args.no_cache else toolchain.compiler_cache(env_cc, wrapper_dir=args.work / "ccwrap", nvcc=nvcc.path)
    results["ccache"] = cc.tool if cc else None
    if cc:
        env_cc.update(cc.env)
        subprocess.run(["ccache", "-z"], env=env_cc, capture_output=True, check=False)
        log(f"compiler cache: {cc.tool} at {cc.path}, nvcc wrapper {cc.nvcc_wrapper}")
    else:
        log("no compiler cache available: (b) runs without one and the warm rebuild is skipped")

    def remaining() -> float:
        return args.deadline - (time.monotonic() - T0)

    # (a) upstream default
    va = args.work / "upstream"
    if args.baseline:
        ra = json.loads(args.baseline.read_text())["upstream"]
        results["upstream"] = {**ra, "from": str(args.baseline), "cross_run": True}
        log(f"(a) taken from {args.baseline}: wall {ra['wall_s']:.1f}s (another run: cross-run comparison)")
    else:
        targets = make_variant(text, va, args.units, up_threads, None)
        log(f"(a) upstream: {len(targets)} units, -j {up_jobs}")
        ra = run_ninja(va, targets, up_jobs, dict(os.environ), timeout=remaining() * 0.6)
        ra.update(summarize(va, f"flash-attn sample, upstream default: {up_jobs} jobs x {up_threads} threads"))
        results["upstream"] = ra
        log(f"(a) rc={ra['rc']} wall {ra['wall_s']:.1f}s sys peak {ra['sys_used_peak'] / 1e9:.1f} GB")
    save()

    # (b) kforge
    vb = args.work / "kforge"
    targets_b = make_variant(text, vb, args.units, choice.nvcc_threads, str(cc.nvcc_wrapper) if cc and cc.nvcc_wrapper else None)
    log(f"(b) kforge: -j {choice.max_jobs}")
    rb = run_ninja(vb, targets_b, choice.max_jobs, env_cc if cc else dict(os.environ), timeout=remaining() - 25)
    rb.update(summarize(vb, f"flash-attn sample, kforge: {choice.max_jobs} jobs x {choice.nvcc_threads} threads"
                          + (" (ccache cold)" if cc else " (no compiler cache)")))
    results["kforge"] = rb
    log(f"(b) rc={rb['rc']} wall {rb['wall_s']:.1f}s sys peak {rb['sys_used_peak'] / 1e9:.1f} GB")
    if cc:
        results["ccache_cold_stats"] = ccache_stats(env_cc)
    measured = measure.read_measures(vb / "units.jsonl")
    updated = profiles.record(cache, "flash-attn", 1, measured)
    results["profile_after"] = {"peak_rss_per_unit": updated.peak_rss_per_unit, "unit_seconds": updated.unit_seconds,
                                "samples": updated.samples, "source": updated.source}
    save()

    # warm rebuild with the cache
    if cc and rb["rc"] == 0 and remaining() > 15:
        shutil.rmtree(vb / "obj")
        (vb / ".ninja_log").rename(vb / "ninja_log.cold")
        subprocess.run(["ccache", "-z"], env=env_cc, capture_output=True, check=False)
        rw = run_ninja(vb, targets_b, choice.max_jobs, env_cc, timeout=max(5.0, remaining()))
        rw["ccache_stats"] = ccache_stats(env_cc)
        results["warm"] = rw
        log(f"warm rebuild: rc={rw['rc']} wall {rw['wall_s']:.1f}s")
        log(rw["ccache_stats"])

    # comparison
    common = [u for u in ra["units"] if u in rb["units"]]
    if ra["rc"] == 0 and rb["rc"] == 0 and common:
        ratios = [rb["units"][u]["seconds"] / ra["units"][u]["seconds"] for u in common]
        contention = statistics.median(ratios)
        est = {"upstream_lpt_8": FACTS_LPT[8], "upstream_real_8": FACTS_REAL_8}
        if choice.max_jobs in FACTS_LPT:
            est["kforge_lpt"] = FACTS_LPT[choice.max_jobs] * contention
            est["ratio_vs_lpt_8"] = FACTS_LPT[8] / est["kforge_lpt"]
            est["ratio_vs_real_8"] = FACTS_REAL_8 / est["kforge_lpt"]
        results["comparison"] = {"sample_ratio": ra["wall_s"] / rb["wall_s"], "contention_median": contention,
                                 "contention_min": min(ratios), "contention_max": max(ratios),
                                 "full_build_estimate": est}
        log(f"sample: upstream {ra['wall_s']:.1f}s vs kforge {rb['wall_s']:.1f}s = {ra['wall_s'] / rb['wall_s']:.2f}x; "
            f"per-unit slowdown at -j{choice.max_jobs} vs -j{up_jobs}: median {contention:.2f}")
        log(f"full-build estimate: {json.dumps(est)}")
    save()
    for name, vdir in (("upstream", va), ("kforge", vb)):
        if (vdir / "timeline.html").exists():
            shutil.copy(vdir / "timeline.html", args.out / f"timeline_{name}.html")
    return 0 if ra["rc"] == 0 and rb["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
