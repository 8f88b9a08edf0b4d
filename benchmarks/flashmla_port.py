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

Besides the port's default, A/B variants of it run through the env switches its dispatch reads
(FLASH_MLA_PORT_BLOCK_M, _KSPLIT, _QREG, _RESCALE_THRESHOLD, _LEGACY_GRID, _ONE_CTA_PER_SM: see
docs/flashmla-sm120-port.md);
--no-variants times only the default. _LEGACY_GRID only changes anything once the dispatch sizes
num_sm_parts with sm120::mma_num_sm_parts (the row says "same grid" otherwise).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys

# (name, env, applies to h_q): every variant runs with FLASH_MLA_FORCE_PORT=1 on top of its env.
VARIANTS = [
    # The default (no variant) is 16-row CTAs up to 16 rows, the 8-warp 32-row kernel for 17-32, the 4-warp 32-row
    # KSPLIT kernel (Q partly in registers) from 33 (sm120::mma_block_m / mma_w8_32).
    ("bm16", {"FLASH_MLA_PORT_BLOCK_M": "16"}, lambda h_q: h_q == 32),  # two 16-row CTAs per KV head
    ("bm32", {"FLASH_MLA_PORT_BLOCK_M": "32"}, lambda h_q: h_q == 32),  # the 4-warp 32-row KSPLIT kernel
    ("bm32w8", {"FLASH_MLA_PORT_BLOCK_M": "32w8"}, lambda h_q: h_q >= 64),  # the 8-warp kernel, 32 rows a CTA
    ("bm64", {"FLASH_MLA_PORT_BLOCK_M": "64"}, lambda h_q: h_q >= 64),  # the 8-warp kernel, 64 rows a CTA
    ("thr0", {"FLASH_MLA_PORT_RESCALE_THRESHOLD": "0"}, lambda h_q: h_q >= 64),  # move the max whenever it grows
    # a later move of the max (fewer O rescales; the fp32 accumulators take 2^12 and 2^15 with room to spare)
    ("thr12", {"FLASH_MLA_PORT_RESCALE_THRESHOLD": "12"}, lambda h_q: h_q >= 64),
    ("thr15", {"FLASH_MLA_PORT_RESCALE_THRESHOLD": "15"}, lambda h_q: h_q >= 64),
    # the 4-warp KSPLIT kernel with four of its nine k-steps of Q in registers (the default until 2026-11-28: five)
    ("qreg4", {"FLASH_MLA_PORT_QREG": "4"}, lambda h_q: h_q >= 64),
    # sm_120's occupancy on Hopper: every port CTA alone on its SM (sm_120 has 100 KB of shared memory a SM and each
    # port CTA takes 84-101 KB); with bm64 / bm32w8 (one CTA a SM on Hopper already) it compares the kernels there
    ("one-cta", {"FLASH_MLA_PORT_ONE_CTA_PER_SM": "1"}, lambda h_q: True),
    ("one-cta-bm16", {"FLASH_MLA_PORT_ONE_CTA_PER_SM": "1", "FLASH_MLA_PORT_BLOCK_M": "16"}, lambda h_q: h_q == 32),
    # the 4-warp KSPLIT kernel alone on its SM (one-cta picks the 8-warp 64-row kernel from 64 rows, as sm_120 does)
    ("one-cta-bm32", {"FLASH_MLA_PORT_ONE_CTA_PER_SM": "1", "FLASH_MLA_PORT_BLOCK_M": "32"}, lambda h_q: h_q >= 64),
]
PORT_ENV = (
    "FLASH_MLA_FORCE_PORT",
    "FLASH_MLA_PORT_BLOCK_M",
    "FLASH_MLA_PORT_KSPLIT",
    "FLASH_MLA_PORT_QREG",
    "FLASH_MLA_PORT_RESCALE_THRESHOLD",
    "FLASH_MLA_PORT_LEGACY_GRID",
    "FLASH_MLA_PORT_ONE_CTA_PER_SM",
)

SHAPES = [  # (batch, h_q, mean seqlen_k)
    (32, 16, 4096),
    (64, 16, 8192),
    (132, 16, 4096),
    (132, 16, 16384),
    (32, 16, 32768),
    (32, 32, 4096),
    (64, 32, 8192),
    (132, 32, 4096),
    (132, 32, 16384),
    (32, 32, 32768),
    (128, 64, 4096),
    (128, 64, 8192),
    (128, 128, 4096),
    (128, 128, 8192),
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
    parser.add_argument("--no-variants", action="store_true", help="time only wgmma and the port's default")
    parser.add_argument("--h-q", help="only the shapes with these h_q, e.g. 64,128")
    parser.add_argument("--variants", help="only these variants, e.g. thr12,qreg4 (default: all that apply)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds over a shape's implementations, interleaved; each time is the median of the "
                             "rounds' do_bench medians (default 1)")
    args = parser.parse_args(argv)
    try:
        only_h_q = {int(x) for x in args.h_q.split(",")} if args.h_q else None
    except ValueError:
        parser.error(f"--h-q {args.h_q!r}: a comma-separated list of head counts, e.g. 64,128")
    known = {name for name, _, _ in VARIANTS}
    only_variants = set(args.variants.split(",")) if args.variants else None
    if only_variants is not None and not only_variants <= known:
        parser.error(f"--variants: unknown {sorted(only_variants - known)}; known: {', '.join(sorted(known))}")
    if args.repeat < 1:
        parser.error("--repeat: at least 1")

    import flash_mla
    import torch
    import triton
    from flash_mla.flash_mla_interface import get_dense_decode_impl

    dev = torch.cuda.get_device_name()
    rows = []
    for b, h_q, s_k in SHAPES:
        if only_h_q is not None and h_q not in only_h_q:
            continue
        q, k_cache, block_table, seqlens, mean_len = make_inputs(torch, b, h_q, s_k)
        res = {"batch": b, "h_q": h_q, "mean_seqlen": round(mean_len, 1)}
        outs = {}
        impls = [("sm90_wgmma", {}), ("sm120_mma_port", {"FLASH_MLA_FORCE_PORT": "1"})]
        if not args.no_variants:
            impls += [
                (f"sm120_mma_port_{name}", {"FLASH_MLA_FORCE_PORT": "1", **env})
                for name, env, applies in VARIANTS
                if applies(h_q) and (only_variants is None or name in only_variants)
            ]
        times = {impl: [] for impl, _ in impls}
        for impl, env in [x for _ in range(args.repeat) for x in impls]:
            for key in PORT_ENV:
                os.environ.pop(key, None)
            os.environ.update(env)
            want = "sm90_wgmma" if impl == "sm90_wgmma" else "sm120_mma_port"
            assert get_dense_decode_impl() == want, get_dense_decode_impl()
            meta, _ = flash_mla.get_mla_metadata()

            run = functools.partial(flash_mla.flash_mla_with_kvcache, q, k_cache, block_table, seqlens, 512, meta, None)

            outs[impl] = run()[0].float()
            torch.cuda.synchronize()
            times[impl].append(triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median"))
            if len(times[impl]) < args.repeat:
                continue
            ms = statistics.median(times[impl])
            nbytes = b * (h_q * 576 * 2 + mean_len * 576 * 2 + h_q * 512 * 2)
            flops = b * h_q * (2 * 576 * mean_len + 2 * mean_len * 512)
            res[impl] = {"us": ms * 1e3, "us_rounds": [t * 1e3 for t in times[impl]],
                         "GBps": nbytes / (ms * 1e-3) / 1e9, "TFLOPs": flops / (ms * 1e-3) / 1e12}
            if impl != "sm90_wgmma":
                res[impl]["max_abs_diff"] = (outs["sm90_wgmma"] - outs[impl]).abs().max().item()
                res[impl]["bw_ratio"] = res[impl]["GBps"] / res["sm90_wgmma"]["GBps"]
                # the median of the rounds' own ratios (wgmma and this implementation timed in the same round)
                res[impl]["bw_ratio_of_rounds"] = statistics.median(
                    w / t for w, t in zip(times["sm90_wgmma"], times[impl], strict=True))
        for key in PORT_ENV:
            os.environ.pop(key, None)
        res["max_abs_diff"] = res["sm120_mma_port"]["max_abs_diff"]
        res["bw_ratio"] = res["sm120_mma_port"]["bw_ratio"]
        rows.append(res)
        print(json.dumps(res), flush=True)

    print(f"\ndevice: {dev}")
    print(
        f"{'b':>4} {'h_q':>4} {'seqlen':>7} | {'wgmma us':>9} {'GB/s':>6} {'TF/s':>5} | {'port us':>9} {'GB/s':>6} {'TF/s':>5} | ratio  maxdiff"
    )
    for r in rows:
        w, p = r["sm90_wgmma"], r["sm120_mma_port"]
        print(
            f"{r['batch']:>4} {r['h_q']:>4} {r['mean_seqlen']:>7.0f} | {w['us']:>9.1f} {w['GBps']:>6.0f} {w['TFLOPs']:>5.0f} | "
            f"{p['us']:>9.1f} {p['GBps']:>6.0f} {p['TFLOPs']:>5.0f} | {r['bw_ratio']:.2f}  {r['max_abs_diff']:.2e}"
        )
        for impl in r:
            if not impl.startswith("sm120_mma_port_"):
                continue
            q = r[impl]
            print(
                f"{'':>4} {'':>4} {impl[len('sm120_mma_port_') :]:>7} | {'':>9} {'':>6} {'':>5} | {q['us']:>9.1f} {q['GBps']:>6.0f} "
                f"{q['TFLOPs']:>5.0f} | {q['bw_ratio']:.2f}  {q['max_abs_diff']:.2e}"
            )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"device": dev, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
