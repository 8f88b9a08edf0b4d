"""Benchmark: the same hard-coded-arch upstream built with kforge's arch enforcement on and off, same run.

The upstream is tests/fixtures/gencode_tiny (setup.py: nvcc with ``-gencode`` for sm_75/80/90 and
``--threads 4``; CMakeLists.txt: ``CMAKE_CUDA_ARCHITECTURES 75 80 90``), declared by forge.toml alone.
Each round builds ``gencode-sm90`` with ``kforge build`` twice, from a fresh work dir and without a
compiler cache: once with ``arch_enforce = "on"`` (kforge's nvcc wrapper rewrites every nvcc step to
sm_90 + compute_90) and once with ``"off"`` (the upstream's three archs). The order alternates
between rounds so that neither mode always runs on a warmer machine. Reported per mode: the build
step's wall time (kforge's own measurement of ``pip wheel``), the whole ``kforge build`` wall time,
the CPU time (user + sys) of every process the build ran (less sensitive than wall time to other work
on a shared machine; the 1-minute load average after each build is recorded too), and the archs the
published wheel holds::

    PYTHONPATH=src python3 benchmarks/arch_enforce.py --rounds 3 [--out results.json]

Needs nvcc (CUDA_HOME or /usr/local/cuda-13.0), cmake and gcc; no GPU, no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from kforge_gencode import make_mono  # noqa: E402

_BUILT = re.compile(r"built \S+ in (\d+) s")
_STEP = re.compile(r"<== build ok in ([\d.]+) s")


def build_once(mode: str, base: Path, env: dict[str, str]) -> dict[str, object]:
    root = make_mono(base / f"mono-{mode}", mode=mode)
    shutil.rmtree(root / ".kforge", ignore_errors=True)
    shutil.rmtree(root / "wh", ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "kforge.cli", "build", "gencode-sm90", "--wheelhouse", str(root / "wh"),
                          "--no-progress"], cwd=root, env=env, capture_output=True, text=True, timeout=1800, check=False)
    total = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"kforge build ({mode}) failed with exit code {out.returncode}:\n{out.stderr[-3000:]}")
    step = _STEP.search(out.stderr)
    (wheel,) = (root / "wh" / "gencode").glob("*.whl")
    manifest = json.loads(Path(str(wheel) + ".manifest.json").read_text())
    codes = sorted({name for b in manifest["doctor"]["binaries"] for name in (*b["sass_archs"], *b["ptx_archs"])})
    return {"mode": mode, "build_step_s": float(step.group(1)) if step else None, "kforge_build_s": round(total, 1),
            "cpu_s": round(cpu, 1), "load_1min": round(os.getloadavg()[0], 1), "codes": codes,
            "wheel_bytes": wheel.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="builds per mode (alternating order), default 3")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if not shutil.which("cmake"):
        raise SystemExit("cmake is not on PATH: the fixture's second library is built with CMake")
    env = dict(os.environ)
    if not env.get("CUDA_HOME") and Path("/usr/local/cuda-13.0/bin/nvcc").is_file():
        env["CUDA_HOME"] = "/usr/local/cuda-13.0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["KFORGE_COMPILER_CACHE"] = "none"  # measure compiles, not cache hits
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="kforge-archbench-") as tmp:
        env["KFORGE_CACHE"] = str(Path(tmp) / "cache")
        for i in range(args.rounds):
            for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
                result = build_once(mode, Path(tmp), env)
                runs.append(result)
                print(json.dumps(result), flush=True)
    summary = {}
    for mode in ("on", "off"):
        mine = [r for r in runs if r["mode"] == mode]
        steps = [float(r["build_step_s"]) for r in mine if r["build_step_s"] is not None]  # type: ignore[arg-type]
        totals = [float(r["kforge_build_s"]) for r in mine]  # type: ignore[arg-type]
        cpu = [float(r["cpu_s"]) for r in mine]  # type: ignore[arg-type]
        summary[mode] = {"build_step_median_s": statistics.median(steps) if steps else None,
                         "kforge_build_median_s": statistics.median(totals), "cpu_median_s": statistics.median(cpu),
                         "codes": mine[0]["codes"], "wheel_bytes": mine[0]["wheel_bytes"]}
    data = {"cpus": os.cpu_count(), "rounds": args.rounds, "runs": runs, "summary": summary}
    if args.out:
        args.out.write_text(json.dumps(data, indent=2) + "\n")
    for mode, s in summary.items():
        print(f"arch_enforce={mode}: build step median {s['build_step_median_s']} s, kforge build median "
              f"{s['kforge_build_median_s']} s, CPU (user+sys of every process) median {s['cpu_median_s']} s, "
              f"wheel holds {' '.join(s['codes'])} ({s['wheel_bytes']} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
