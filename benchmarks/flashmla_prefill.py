"""Times FlashMLA's dense prefill (forward and backward) on kforge's sm_120 port against FlashAttention-2.

Runs on a GPU where a FlashMLA build with the port is installed (on Hopper: `flashmla-sm90 --profile
sm120-port`; the port is forced with FLASH_MLA_FORCE_PORT=1, and the script checks
`get_dense_prefill_impl()` says so before it times anything):

    python benchmarks/flashmla_prefill.py [--out results.json] [--seqlens 2048,4096,8192] [--runs 10]

Both are mma.sync kernels, so FlashAttention-2 is the honest proxy for what sm_120 can do. The
FlashAttention-2 column is the `flash_attn` wheel when it is importable, else FlashAttention-2's kernels as
PyTorch ships them (SDPA's flash backend: `flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel` and friends); the
result names which one ran. FA2 has no d_qk != d_v, so the port's (192, 128) runs against FA2 at head dim
192 for q, k and v, and (128, 128) against FA2 at 128; each column's TFLOP/s counts its own work, as
upstream FlashMLA's test counts it:

    fwd FLOPs = 2 * attended (q, k) pairs * heads * (d_qk + d_v)
    bwd FLOPs = 2 * attended (q, k) pairs * heads * (3 * d_qk + 2 * d_v)

(attended pairs halve, about, when causal). Same process, same GPU, interleaved rounds: each round times
every column once (CUDA events around `--iters` calls); the table has the median of `--runs` rounds after
`--warmup` rounds. Inputs: bf16, batch x seqlen = `--tokens` tokens, `--heads` heads, q = k lengths.
The port's outputs are compared with FA2's at (128, 128) (max abs difference), so a fast wrong kernel shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def attended_pairs(seqlen: int, causal: bool) -> int:
    return seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen


def timed(torch, fn, iters):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def run_shape(torch, flash_mla, flash_attn, args, dqk, dv, seqlen, batch, h, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16
    dfa = dqk  # FA2 runs q, k, v at d_qk
    torch.manual_seed(0)
    total = batch * seqlen
    cu = torch.arange(0, total + 1, seqlen, dtype=torch.int32, device="cuda")
    q = torch.randn(total, h, dqk, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(total, h, dqk, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(total, h, dv, device="cuda", dtype=dt, requires_grad=True)
    do = torch.randn(total, h, dv, device="cuda", dtype=dt)
    qf = torch.randn(batch, seqlen, h, dfa, device="cuda", dtype=dt, requires_grad=True)
    kf = torch.randn(batch, seqlen, h, dfa, device="cuda", dtype=dt, requires_grad=True)
    vf = torch.randn(batch, seqlen, h, dfa, device="cuda", dtype=dt, requires_grad=True)
    dof = torch.randn(batch, seqlen, h, dfa, device="cuda", dtype=dt)

    def port_fwd():
        return flash_mla.flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=causal)[0]

    if flash_attn is not None:

        def fa2_fwd():
            return flash_attn.flash_attn_func(qf, kf, vf, causal=causal)
    else:

        def fa2_fwd():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2), is_causal=causal
                ).transpose(1, 2)

    o_port = port_fwd()
    o_fa2 = fa2_fwd()

    def port_bwd():
        torch.autograd.grad(o_port, (q, k, v), do, retain_graph=True)

    def fa2_bwd():
        torch.autograd.grad(o_fa2, (qf, kf, vf), dof, retain_graph=True)

    diff = None
    if dqk == dv:  # same math: compare on FA2's inputs
        with torch.no_grad():
            o_cmp = flash_mla.flash_attn_varlen_func(
                qf.detach().reshape(total, h, dfa),
                kf.detach().reshape(total, h, dfa),
                vf.detach().reshape(total, h, dfa),
                cu,
                cu,
                seqlen,
                seqlen,
                causal=causal,
            )[0]
        diff = (o_cmp.float() - o_fa2.detach().reshape(total, h, dfa).float()).abs().max().item()

    fns = {"port_fwd": port_fwd, "fa2_fwd": fa2_fwd, "port_bwd": port_bwd, "fa2_bwd": fa2_bwd}
    times = {n: [] for n in fns}
    for r in range(args.warmup + args.runs):
        for n, fn in fns.items():
            ms = timed(torch, fn, args.iters)
            if r >= args.warmup:
                times[n].append(ms)
    pairs_ = attended_pairs(seqlen, causal) * batch
    flops = {
        "port_fwd": 2 * pairs_ * h * (dqk + dv),
        "fa2_fwd": 2 * pairs_ * h * (dfa + dfa),
        "port_bwd": 2 * pairs_ * h * (3 * dqk + 2 * dv),
        "fa2_bwd": 2 * pairs_ * h * (3 * dfa + 2 * dfa),
    }
    res = {
        "pair": f"{dqk}x{dv}",
        "fa2_head_dim": dfa,
        "seqlen": seqlen,
        "batch": batch,
        "heads": h,
        "causal": causal,
        "max_abs_diff_vs_fa2": diff,
    }
    for n in fns:
        med = statistics.median(times[n])
        res[n] = {"ms": med, "tflops": flops[n] / (med * 1e-3) / 1e12}
    res["ratio_fwd"] = res["port_fwd"]["tflops"] / res["fa2_fwd"]["tflops"]
    res["ratio_bwd"] = res["port_bwd"]["tflops"] / res["fa2_bwd"]["tflops"]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--seqlens", default="2048,4096,8192")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--pairs", default="192x128,128x128")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    os.environ["FLASH_MLA_FORCE_PORT"] = "1"
    import flash_mla
    from flash_mla.flash_mla_interface import get_dense_prefill_impl

    impl = get_dense_prefill_impl()
    if "port" not in impl:
        print(
            f"flashmla_prefill: the dense prefill in use is {impl!r}, not the sm_120 port; "
            "install a FlashMLA build with the port (kforge build flashmla-sm90 --profile sm120-port)",
            file=sys.stderr,
        )
        return 2
    try:
        import flash_attn

        fa2_name = f"flash_attn {flash_attn.__version__} wheel"
    except ImportError:
        flash_attn = None
        fa2_name = f"FlashAttention-2 in torch {torch.__version__} (SDPA flash backend)"
    dev = torch.cuda.get_device_name()
    rows = []

    for pair in args.pairs.split(","):
        dqk, dv = (int(x) for x in pair.split("x"))
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            batch = max(1, args.tokens // seqlen)
            for causal in (False, True):
                res = run_shape(torch, flash_mla, flash_attn, args, dqk, dv, seqlen, batch, args.heads, causal)
                rows.append(res)
                print(json.dumps(res), flush=True)
                torch.cuda.empty_cache()

    meta = {
        "device": dev,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "fa2": fa2_name,
        "port": impl,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": args.runs,
        "iters": args.iters,
        "tokens": args.tokens,
    }
    print(f"\n{meta}")
    print("| (d_qk, d_v) | FA2 d | causal | seqlen | port fwd | FA2 fwd | fwd ratio | port bwd | FA2 bwd | bwd ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| ({r['pair'].replace('x', ', ')}) | {r['fa2_head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | "
            f"{r['port_fwd']['tflops']:.0f} | {r['fa2_fwd']['tflops']:.0f} | {r['ratio_fwd']:.2f} | "
            f"{r['port_bwd']['tflops']:.0f} | {r['fa2_bwd']['tflops']:.0f} | {r['ratio_bwd']:.2f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
