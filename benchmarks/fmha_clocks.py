"""SM clock, power and work per clock of kforge_fmha against SDPA cuDNN under sustained load.

The H200 lowers its SM clock under power draw, so a kernel that spends fewer cycles can still run
slower if it draws more power. Each phase runs one implementation back to back for --seconds
while `nvidia-smi` samples the SM clock and power every 100 ms; phases alternate (ours, cuDNN,
ours, cuDNN) so that a drift shows. Per phase: TFLOP/s (CUDA events over the whole phase), the
median SM clock and power of the samples inside it, and FLOP per SM clock (TFLOP/s / MHz): the
cycle efficiency, free of the clock (kFLOP per SM clock over the whole GPU).

    python benchmarks/fmha_clocks.py [--seqlens 2048,16384] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import kforge_fmha
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def sampler():
    """nvidia-smi printing 'SM MHz, watts' lines every 100 ms (the reader stamps each with the
    host clock)."""
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
         "-lms", "100", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
        stdout=subprocess.PIPE, text=True, bufsize=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="2048,16384")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--path", default="default", help="KFORGE_FMHA_SM90_PATH for ours")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.path != "default":
        os.environ["KFORGE_FMHA_SM90_PATH"] = args.path
    dev = torch.cuda.get_device_name(0)
    print(f"{dev}; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; bf16, hdim 128, "
          f"non-causal, 16 heads, 16384 tokens, path {args.path}")
    samples: list[tuple[float, float, float]] = []
    if shutil.which("nvidia-smi") is None:
        print("fmha_clocks.py: nvidia-smi is not on PATH; it samples the SM clock and power, so run "
              "this on a machine with the NVIDIA driver's tools", file=sys.stderr)
        return 2
    proc = sampler()

    def reader():
        for line in proc.stdout:
            parts = [x.strip() for x in line.split(",")]
            try:
                samples.append((time.time(), float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                pass

    threading.Thread(target=reader, daemon=True).start()
    rows = []
    try:
        for seqlen in (int(s) for s in args.seqlens.split(",")):
            b = max(1, 16384 // seqlen)
            q, k, v = (torch.randn(b, seqlen, 16, 128, dtype=torch.bfloat16, device="cuda")
                       for _ in range(3))
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            fl = 4.0 * b * 16 * seqlen * seqlen * 128

            def cudnn(qt=qt, kt=kt, vt=vt):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt)

            def ours(q=q, k=k, v=v):
                return kforge_fmha.fmha_fwd(q, k, v)

            fns = {"kforge": ours, "cudnn": cudnn}
            for fn in fns.values():  # warm-up
                for _ in range(5):
                    fn()
            torch.cuda.synchronize()
            kernel = kforge_fmha.last_kernel()
            for phase, name in enumerate(["kforge", "cudnn", "kforge", "cudnn"]):
                fn = fns[name]
                t_end = time.time() + args.seconds
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                calls = 0
                t0 = time.time()
                start.record()
                while time.time() < t_end:
                    for _ in range(10):
                        fn()
                    calls += 10
                    # keep the queue short, so that the host clock tracks the GPU's
                    torch.cuda.current_stream().synchronize()
                end.record()
                torch.cuda.synchronize()
                t1 = time.time()
                ms = start.elapsed_time(end) / calls
                inside = [s for s in samples if t0 + 0.3 <= s[0] <= t1]  # skip the ramp
                clk = statistics.median(s[1] for s in inside) if inside else float("nan")
                pw = statistics.median(s[2] for s in inside) if inside else float("nan")
                tf = fl / ms / 1e9
                row = {"seqlen": seqlen, "phase": phase, "impl": name, "kernel": kernel if name == "kforge" else "cudnn",
                       "ms": ms, "tflops": tf, "sm_mhz": clk, "watts": pw, "samples": len(inside),
                       "kflop_per_clock": tf * 1e3 / clk if inside else None}
                rows.append(row)
                print(f"L={seqlen:5d} phase {phase} {name:6s} {tf:6.1f} TFLOP/s  SM {clk:6.0f} MHz  "
                      f"{pw:5.0f} W  {row['kflop_per_clock'] or float('nan'):6.1f} kFLOP per SM clock "
                      f"({len(inside)} samples)", flush=True)
    finally:
        proc.terminate()
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
