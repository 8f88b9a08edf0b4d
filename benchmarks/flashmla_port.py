"""Times kforge's sm_120 FlashMLA decode port against upstream's sm90 wgmma kernel on one GPU.

Runs on a Hopper GPU with a FlashMLA build that has both (the sm90 kernels plus the port):
    python benchmarks/flashmla_port.py [--out results.json]
Both implementations run in the same process on the same inputs (FLASH_MLA_FORCE_PORT toggles the
dispatch per call). Each shape: bf16, one query token (s_q=1), varlen cache_seqlens drawn like
upstream's test (normal(mean, mean/2), at least s_q), page block 64, h_kv=1. The timed region is one
flash_mla_with_kvcache call (split-KV kernel + combine), scheduler metadata built once beforehand.
Time: triton.testing.do_bench median. Bytes and FLOPs as upstream's test counts them:
    bytes = b * (s_q*h_q*576*2 + mean_seqlen*576*2 + s_q*h_q*512*2)
    flops = b * h_q * s_q * (2*576*mean_seqlen + 2*mean_seqlen*512)
The two outputs are also compared (max abs difference) so a fast wrong kernel shows.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys

SHAPES = [  # (batch, h_q, mean seqlen_k)
    (32, 16, 4096), (64, 16, 8192), (132, 16, 4096), (132, 16, 16384), (32, 16, 32768),
    (32, 32, 4096), (64, 32, 8192), (132, 32, 4096), (132, 32, 16384), (32, 32, 32768),
    (128, 64, 4096), (128, 64, 8192),
    (128, 128, 4096), (128, 128, 8192),
]


def make_inputs(torch, b, h_q, s_k, s_q=1, h_kv=1, d=576, block=64, seed=0):
    random.seed(seed)
    torch.manual_seed(seed)
    seqlens = [max(int(random.normalvariate(s_k, s_k / 2)), s_q) for _ in range(b)]
    max_len = max(seqlens)
    blocks_per_seq = (max_len + 255) // 256 * 256 // block
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    q = (torch.randn(b, s_q, h_q, d, device="cuda") / 10).clamp(-1, 1).to(torch.bfloat16)
    perm = torch.randperm(b * blocks_per_seq, device="cuda").to(torch.int32)
    block_table = perm.view(b, blocks_per_seq)
    k_cache = (torch.randn(b * blocks_per_seq, block, h_kv, d, device="cuda") / 10).clamp(-1, 1).to(torch.bfloat16)
    return q, k_cache, block_table, cache_seqlens, sum(seqlens) / b


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    import flash_mla
    import torch
    import triton
    from flash_mla.flash_mla_interface import get_dense_decode_impl

    dev = torch.cuda.get_device_name()
    rows = []
    for b, h_q, s_k in SHAPES:
        q, k_cache, block_table, seqlens, mean_len = make_inputs(torch, b, h_q, s_k)
        res = {"batch": b, "h_q": h_q, "mean_seqlen": round(mean_len, 1)}
        outs = {}
        impls = [("sm90_wgmma", None, None), ("sm120_mma_port", "1", None)]
        if h_q == 32:  # the port's alternative for 32 rows: two 16-row CTAs per KV head
            impls.append(("sm120_mma_port_bm16", "1", "16"))
        for impl, force, block_m in impls:
            if force:
                os.environ["FLASH_MLA_FORCE_PORT"] = force
            else:
                os.environ.pop("FLASH_MLA_FORCE_PORT", None)
            if block_m:
                os.environ["FLASH_MLA_PORT_BLOCK_M"] = block_m
            else:
                os.environ.pop("FLASH_MLA_PORT_BLOCK_M", None)
            assert get_dense_decode_impl() == impl.replace("_bm16", ""), get_dense_decode_impl()
            meta, _ = flash_mla.get_mla_metadata()

            run = functools.partial(flash_mla.flash_mla_with_kvcache, q, k_cache, block_table, seqlens, 512, meta, None)

            outs[impl] = run()[0].float()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median")
            nbytes = b * (h_q * 576 * 2 + mean_len * 576 * 2 + h_q * 512 * 2)
            flops = b * h_q * (2 * 576 * mean_len + 2 * mean_len * 512)
            res[impl] = {"us": ms * 1e3, "GBps": nbytes / (ms * 1e-3) / 1e9, "TFLOPs": flops / (ms * 1e-3) / 1e12}
        os.environ.pop("FLASH_MLA_FORCE_PORT", None)
        os.environ.pop("FLASH_MLA_PORT_BLOCK_M", None)
        if "sm120_mma_port_bm16" in outs:
            res["max_abs_diff_bm16"] = (outs["sm90_wgmma"] - outs["sm120_mma_port_bm16"]).abs().max().item()
            res["bw_ratio_bm16"] = res["sm120_mma_port_bm16"]["GBps"] / res["sm90_wgmma"]["GBps"]
        res["max_abs_diff"] = (outs["sm90_wgmma"] - outs["sm120_mma_port"]).abs().max().item()
        res["bw_ratio"] = res["sm120_mma_port"]["GBps"] / res["sm90_wgmma"]["GBps"]
        rows.append(res)
        print(json.dumps(res), flush=True)

    print(f"\ndevice: {dev}")
    print(f"{'b':>4} {'h_q':>4} {'seqlen':>7} | {'wgmma us':>9} {'GB/s':>6} {'TF/s':>5} | {'port us':>9} {'GB/s':>6} {'TF/s':>5} | ratio  maxdiff")
    for r in rows:
        w, p = r["sm90_wgmma"], r["sm120_mma_port"]
        print(f"{r['batch']:>4} {r['h_q']:>4} {r['mean_seqlen']:>7.0f} | {w['us']:>9.1f} {w['GBps']:>6.0f} {w['TFLOPs']:>5.0f} | "
              f"{p['us']:>9.1f} {p['GBps']:>6.0f} {p['TFLOPs']:>5.0f} | {r['bw_ratio']:.2f}  {r['max_abs_diff']:.2e}")
        if "sm120_mma_port_bm16" in r:
            q = r["sm120_mma_port_bm16"]
            print(f"{'':>4} {'':>4} {'bm16':>7} | {'':>9} {'':>6} {'':>5} | {q['us']:>9.1f} {q['GBps']:>6.0f} {q['TFLOPs']:>5.0f} | "
                  f"{r['bw_ratio_bm16']:.2f}  {r['max_abs_diff_bm16']:.2e}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"device": dev, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
