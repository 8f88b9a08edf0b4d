"""FlashAttention-2's backward at the tile it runs on an H100 / A100 and at the one it runs where a
block gets at most 99 KiB of shared memory (sm_86, sm_89, sm_120), against kforge_fmha's portable
backward (which must fit sm_120's 99 KiB) and SDPA flash, on one GPU, in one process.

Why: issue 31 compares the portable backward with FlashAttention-2 "on the same GPU". On an H100 /
H200 FlashAttention-2 takes a 144 KiB tile (64 queries x 128 keys at head dim 128), which no kernel
for sm_120 can use; on an RTX 4090 / 5090 it runs a 99 KiB one. Both tiles are FlashAttention-2's
own kernels, launched by benchmarks/fa2_tiles/fa2_tiles.cu (kforge's harness, built against a
flash-attention source tree: `build`), so the H200 can time what FlashAttention-2 would run on
sm_120, next to what kforge's portable kernel runs there.

    python benchmarks/fa2_bwd_tiles.py build --fa2-src FLASH_ATTENTION_TREE --out libfa2tiles.so
    python benchmarks/fa2_bwd_tiles.py run --lib libfa2tiles.so --out docs/benchmarks/fa2-tiles

Columns (backward alone, median of --runs interleaved rounds, benchmarks/timing.py):
fa2-h100 (FlashAttention-2's tile for 144 KiB+ at head dims 64 and 128, 136 KiB+ at 192), fa2-99k (its tile
below that), kforge-portable (kforge_fmha.attention's autograd with KFORGE_FMHA_BWD_PATH=portable),
sdpa-flash (torch's FlashAttention-2 build, autograd). The FlashAttention-2 tiles are called
directly, without autograd (their host cost a call was not measured; timing.py's GPU lead keeps a
round's launch cost out of its first call). bf16; at
(192, 128) the FlashAttention-2 columns run (192, 192) and TFLOP/s count each column's own work.
Gradients of the fa2 columns are compared with SDPA flash's (same dims) before timing.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fmha_bwd (FLOPs, gradient diffs), timing
SOURCE = HERE / "fa2_tiles" / "fa2_tiles.cu"
NVCC_FLAGS = ["-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
              "--expt-extended-lambda", "--use_fast_math", "-Xptxas", "-v",
              *(f"-U__CUDA_NO_{x}__" for x in ("HALF_OPERATORS", "HALF_CONVERSIONS",
                                               "BFLOAT16_OPERATORS", "BFLOAT16_CONVERSIONS",
                                               "BFLOAT162_OPERATORS", "BFLOAT162_CONVERSIONS"))]
COLUMNS = ("fa2-h100", "fa2-99k", "kforge-portable", "sdpa-flash")
LIMIT_99K = 101376  # sm_120's (and sm_86 / sm_89's) shared memory per block
HEAD_DIMS = (64, 128, 192)  # the harness's tiles
PAIRS = ((64, 64), (128, 128), (192, 128))


def build_command(fa2_src: Path, out: Path, arch: str = "90") -> list[str]:
    """nvcc's command line for the harness against a flash-attention tree (csrc/cutlass filled)."""
    inc = [HERE / "fa2_tiles", fa2_src / "csrc/flash_attn/src", fa2_src / "csrc/flash_attn",
           fa2_src / "csrc/cutlass/include"]
    return ["nvcc", *NVCC_FLAGS, "-gencode", f"arch=compute_{arch},code=sm_{arch}",
            *(f"-I{p}" for p in inc), str(SOURCE), "-o", str(out)]


def check_tree(fa2_src: Path) -> str | None:
    """Why a flash-attention tree cannot build the harness, or None."""
    need = [fa2_src / "csrc/flash_attn/src/flash_bwd_launch_template.h",
            fa2_src / "csrc/cutlass/include/cute/tensor.hpp"]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        return (f"{fa2_src} is not a flash-attention tree with its cutlass submodule: missing "
                f"{', '.join(missing)}. Check out Dao-AILab/flash-attention with `git submodule "
                "update --init csrc/cutlass` and pass its root as --fa2-src.")
    return None


def bwd_flops(b: int, h: int, s: int, d_qk: int, d_v: int, causal: bool) -> float:
    """The backward's FLOPs, counted as benchmarks/fmha_bwd.py counts them."""
    from fmha_bwd import MODE_FACTOR, attention_flops

    return attention_flops(b, h, s, d_qk, d_v, causal) * MODE_FACTOR["bwd"]


def render(meta: dict, rows: list[dict]) -> str:
    lines = ["## FlashAttention-2's backward tiles and kforge's portable backward", "",
             f"Device: {meta['device']}; torch {meta['torch']}; {meta['date']}; `{meta['command']}`. "
             "TFLOP/s (each column's own work), backward alone, median of "
             f"{meta['runs']} interleaved rounds. Main-kernel shared memory: fa2-h100 "
             f"{meta['smem']['h100']}, fa2-99k {meta['smem']['99k']} (bytes, by head dim).", "",
             "| (d_qk, d_v) | causal | seqlen | " + " | ".join(COLUMNS)
             + " | portable / fa2-99k | portable / fa2-h100 | fa2-99k / fa2-h100 | diff fa2 vs sdpa |",
             "|---|---|---|" + "---|" * (len(COLUMNS) + 4)]
    for r in rows:
        t = r["tflops"]

        def ratio(a, b, t=t):
            return f"{t[a] / t[b]:.2f}" if isinstance(t.get(a), float) and isinstance(t.get(b), float) else "-"
        cells = [f"{t[c]:.0f}" if isinstance(t.get(c), float) else str(t.get(c, "-")) for c in COLUMNS]
        lines.append(f"| ({r['d_qk']}, {r['d_v']}) | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | "
                     + " | ".join(cells) + f" | {ratio('kforge-portable', 'fa2-99k')} | "
                     f"{ratio('kforge-portable', 'fa2-h100')} | {ratio('fa2-99k', 'fa2-h100')} | "
                     f"{r['diff']:.1e} |")
    return "\n".join(lines) + "\n"


# --- GPU part ----------------------------------------------------------------------------------


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("fa2_bwd_tiles: no CUDA GPU; this benchmark needs one.", file=sys.stderr)
        return 2
    try:
        lib = ctypes.CDLL(str(args.lib))
        lib.fa2t_bwd, lib.fa2t_smem  # noqa: B018 (both symbols must be there)
    except (OSError, AttributeError) as exc:
        print(f"fa2_bwd_tiles: {args.lib} is not the harness library ({exc}); build it with "
              "`python benchmarks/fa2_bwd_tiles.py build --fa2-src TREE --out LIB`.", file=sys.stderr)
        return 2
    lib.fa2t_bwd.restype = ctypes.c_int
    lib.fa2t_bwd.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 11 + [ctypes.c_int] * 5 + [
        ctypes.c_float, ctypes.c_void_p]
    smem = {"h100": {d: lib.fa2t_smem(d, 0) for d in HEAD_DIMS},
            "99k": {d: lib.fa2t_smem(d, 1) for d in HEAD_DIMS}}
    for d, v in smem["99k"].items():
        if v > LIMIT_99K:
            print(f"fa2_bwd_tiles: FlashAttention-2's small tile at head dim {d} takes {v} bytes, "
                  f"over {LIMIT_99K}: this flash-attention tree's tiles are not the ones "
                  "benchmarks/fa2_tiles/fa2_tiles.cu names; build the harness from a tree whose "
                  "flash_bwd_launch_template.h picks those tiles, or update them there.", file=sys.stderr)
            return 1
    rows = []
    for d_qk, d_v in args.pairs:
        for causal in (False, True):
            for s in args.seqlens:
                row = bench_shape(lib, d_qk, d_v, causal, s, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["diff"] > args.max_diff:
                    print(f"fa2_bwd_tiles: FlashAttention-2's tiles differ from SDPA flash by {row['diff']:.1e} "
                          f"(over --max-diff {args.max_diff}) at {row}: the harness does not compute "
                          "the same backward; no ratio is reported.", file=sys.stderr)
                    return 1
                torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "runs": args.runs,
            "command": "python benchmarks/fa2_bwd_tiles.py " + " ".join(sys.argv[1:]),
            "host": platform.node(), "smem": smem,
            "kforge_fmha_library": os.environ.get("KFORGE_FMHA_LIBRARY")}
    text = render(meta, rows)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def bench_shape(lib, d_qk: int, d_v: int, causal: bool, s: int, args) -> dict:
    """One shape: every column's gradients once (the fa2 tiles checked against SDPA flash), then
    the interleaved timing. FlashAttention-2 needs d_qk == d_v: its columns run (d_qk, d_qk)."""
    import kforge_fmha
    import torch
    from fmha_bwd import _BwdPath, rel_diff
    from timing import shape_seed, time_interleaved
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fa_d, heads, b = d_qk, 2048 // d_v, max(1, args.tokens // s)
    scale = d_qk ** -0.5

    def rnd(d):
        return torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16)
    q, k = rnd(d_qk), rnd(d_qk)
    v_fa, do_fa = rnd(fa_d), rnd(fa_d)
    v_k, do_k = (v_fa, do_fa) if d_v == fa_d else (rnd(d_v), rnd(d_v))
    # FlashAttention-2's forward (torch's build) for out and lse
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), v_fa.transpose(1, 2), 0.0, causal, False, scale=scale)
    o, lse = res[0].transpose(1, 2).contiguous(), res[1].contiguous()
    sr = (s + 127) // 128 * 128
    outs = {c: [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v_fa)] for c in ("fa2-h100", "fa2-99k")}
    acc = torch.empty(b, sr, heads, fa_d, device="cuda", dtype=torch.float32)
    dsum = torch.empty(b, heads, sr, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream

    def fa2(small, c):
        dq, dk, dv = outs[c]
        rc = lib.fa2t_bwd(fa_d, small, int(causal), q.data_ptr(), k.data_ptr(), v_fa.data_ptr(),
                          o.data_ptr(), do_fa.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                          dv.data_ptr(), acc.data_ptr(), dsum.data_ptr(), b, s, s, heads, heads, scale,
                          stream)
        if rc != 0:
            raise RuntimeError(f"fa2t_bwd returned {rc}")
        return outs[c]

    def autograd_fn(column):
        ours = column == "kforge-portable"
        qq, kk = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        vv = (v_k if ours else v_fa).detach().requires_grad_(True)
        dout = do_k if ours else do_fa
        if ours:
            with _BwdPath("portable"):
                out = kforge_fmha.attention(qq, kk, vv, causal=causal, softmax_scale=scale)
        else:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(
                    qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), is_causal=causal,
                    scale=scale).transpose(1, 2)

        def fn():
            with _BwdPath("portable" if ours else None):
                return torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)
        return fn

    fns = {"fa2-h100": lambda: fa2(0, "fa2-h100"), "fa2-99k": lambda: fa2(1, "fa2-99k"),
           "kforge-portable": autograd_fn("kforge-portable"), "sdpa-flash": autograd_fn("sdpa-flash")}
    ref = list(fns["sdpa-flash"]())
    diff = max(rel_diff(ref, list(fns[c]())) for c in ("fa2-h100", "fa2-99k"))
    timed = time_interleaved(fns, args.warmup, args.runs, seed=shape_seed("fa2_tiles", d_qk, d_v, causal, s))
    tflops = {}
    for c, ms in timed.items():
        dims = (d_qk, d_v) if c == "kforge-portable" else (fa_d, fa_d)
        tflops[c] = bwd_flops(b, heads, s, *dims, causal) / (ms * 1e-3) / 1e12 if isinstance(ms, float) else ms
    return {"d_qk": d_qk, "d_v": d_v, "causal": causal, "seqlen": s, "batch": b, "heads": heads,
            "ms": timed, "tflops": tflops, "diff": diff}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the harness against a flash-attention tree")
    b.add_argument("--fa2-src", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--arch", default="90")
    r = sub.add_parser("run", help="time the columns on this machine's GPU")
    r.add_argument("--lib", type=Path, required=True)
    r.add_argument("--pairs", default="128x128,192x128,64x64")
    r.add_argument("--seqlens", default="2048,4096,8192")
    r.add_argument("--tokens", type=int, default=16384)
    r.add_argument("--runs", type=int, default=10)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--max-diff", type=float, default=2e-2)
    r.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        why = check_tree(args.fa2_src)
        if why:
            print(f"fa2_bwd_tiles: {why}", file=sys.stderr)
            return 2
        cmd = build_command(args.fa2_src, args.out, args.arch)
        print(" ".join(cmd), flush=True)
        return subprocess.run(cmd).returncode
    try:
        args.pairs = [tuple(int(x) for x in p.split("x")) for p in args.pairs.split(",")]
        args.seqlens = [int(x) for x in args.seqlens.split(",")]
    except ValueError:
        print("fa2_bwd_tiles: --pairs is like 128x128,192x128 and --seqlens like 2048,4096",
              file=sys.stderr)
        return 2
    bad = [p for p in args.pairs if p not in PAIRS]
    if bad:
        print(f"fa2_bwd_tiles: pairs {bad}: the harness has FlashAttention-2's tiles for head dims "
              "64, 128 and 192 only (pairs 64x64, 128x128 and 192x128)", file=sys.stderr)
        return 2
    if not args.lib.is_file():
        print(f"fa2_bwd_tiles: {args.lib} does not exist; build it first (`build`).", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
