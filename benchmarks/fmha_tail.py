"""How much the last partial wave costs kforge_fmha's persistent TMA kernel and SDPA cuDNN:
non-causal hdim 128, bf16, seqlen 2k and 4k, batch 4, with the head count chosen so that the grid
of 128-row tiles is closest to 15.0, 15.5 and 16.0 waves of the GPU's SMs (31, 32 and 33 heads
on a 132-SM H100/H200 at 2k: 1984, 2048 and 2112 tiles).

If the tail costs a whole tile, 15.0 and 15.5 waves take as long as 16.0; if it costs nothing,
the time grows with the tile count. Columns (timed in interleaved rounds,
timing.time_interleaved): the kforge paths of --paths and SDPA cuDNN on the same tensors.

    python benchmarks/fmha_tail.py [--paths tma-dyn-skew,tma-dyn] [--runs 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import kforge_fmha
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import flops, shape_seed, time_interleaved  # noqa: E402


def columns(q, k, v, paths: list[str]):
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def ours(path):
        def fn():
            os.environ["KFORGE_FMHA_SM90_PATH"] = path  # read by the library at every call
            return kforge_fmha.fmha_fwd(q, k, v)
        return fn

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt)

    fns = {path: ours(path) for path in paths}
    fns["cudnn"] = cudnn
    return fns


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="2048,4096")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--paths", default="tma-dyn-skew", help="comma list of KFORGE_FMHA_SM90_PATH values")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    dev = torch.cuda.get_device_properties(0)
    sms = dev.multi_processor_count
    dtype, hdim = torch.bfloat16, 128
    paths = [p for p in args.paths.split(",") if p]
    print(f"{dev.name}, {sms} SMs; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"bf16, hdim {hdim}, non-causal, batch {args.batch}, {args.runs} rounds")
    rows = []
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        m_blocks = (seqlen + 127) // 128
        per_head = args.batch * m_blocks
        # head counts whose tile grid is closest to 15.0, 15.5 and 16.0 waves
        for waves in (15.0, 15.5, 16.0):
            heads = max(1, int(waves * sms / per_head + 0.5))
            tiles = heads * per_head
            q, k, v = (torch.randn(args.batch, seqlen, heads, hdim, dtype=dtype, device="cuda")
                       for _ in range(3))
            fns = columns(q, k, v, paths)
            kernel = {}
            for name, fn in fns.items():
                if name != "cudnn":
                    fn()
                    kernel[name] = kforge_fmha.last_kernel()
            timed = time_interleaved(fns, args.warmup, args.runs, seed=shape_seed(seqlen, heads))
            fl = flops(args.batch, heads, seqlen, hdim, False)
            row = {"seqlen": seqlen, "heads": heads, "tiles": tiles, "waves": tiles / sms,
                   "us": {n: t * 1e3 for n, t in timed.items()},
                   "tflops": {n: fl / t / 1e9 for n, t in timed.items()}, "kernel": kernel}
            rows.append(row)
            cells = " ".join(f"{n}={row['us'][n]:.1f}us({row['tflops'][n]:.0f})" for n in timed)
            print(f"L={seqlen:5d} heads={heads:3d} tiles={tiles:5d} waves={tiles / sms:5.2f} {cells}",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": dev.name, "sms": sms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
