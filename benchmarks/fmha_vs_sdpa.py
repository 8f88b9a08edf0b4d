"""kforge_fmha forward vs torch SDPA (flash, memory-efficient and cuDNN backends).

TFLOP/s from CUDA events: warm-up, then the median of --runs timed calls per shape. FLOPs are
4 * batch * heads * L^2 * head_dim, halved when causal (the convention of FlashAttention's
benchmarks and of the numbers in /work/shared/UPSTREAM_FACTS.md). batch * L = --tokens.
Also measures kforge_fmha's peak extra memory against seqlen (it must grow as O(L)).

    python benchmarks/fmha_vs_sdpa.py --write docs/benchmarks.md
    python benchmarks/fmha_vs_sdpa.py --quick            # bf16 only, ours only (tuning sweeps)
    python benchmarks/fmha_vs_sdpa.py --paths wgmma,tma  # each sm_90a kernel path, same run
    python benchmarks/fmha_vs_sdpa.py --fa3              # plus FlashAttention-3 (flash_attn_interface)

With --fa3, FlashAttention-3's ``flash_attn_interface.flash_attn_func`` (the flash-attn3 wheel
kforge builds: ``nox -s build-flash-attn3-sm90``) is one more column, measured in the same run
on the same tensors; a shape its build left out (a disabled head dim) shows n/a with the error.

With --paths, kforge_fmha runs once per path (KFORGE_FMHA_SM90_PATH, read by the library at
every call) and the table has one row per shape and path; the SDPA columns of a shape are the
same measurement on each of its rows. The kernel column is what kforge_fmha.last_kernel()
reported, so a path that fell back to another kernel shows it.

With --write, the generated part of the section '## fmha vs torch SDPA' in that file (between
the two marker lines BEGIN and END below) is replaced; the rest of the file is kept, the text
written under the table by hand included. A file without the section gets it appended; a section
without the markers is refused (exit 2, nothing written), since replacing it would lose text.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path

import kforge_fmha
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import flops, shape_seed, time_interleaved  # noqa: E402

HEADING = "## fmha vs torch SDPA"
# --write replaces only what lies between these two lines: the section's hand-written record
# (the tuning runs below the table) stays.
BEGIN = "<!-- fmha_vs_sdpa.py --write: generated from here -->"
END = "<!-- fmha_vs_sdpa.py --write: generated up to here -->"
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def time_ms(fn, warmup: int, runs: int) -> float:
    """Median device time of one call. Calls are queued back to back (no sync between them), as
    in a model's forward pass, so the host-side cost of a call overlaps the previous kernel and
    only shows when it is longer than the kernel."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def host_us(fn, calls: int = 200) -> float:
    """Host time of one call (microseconds), with the GPU queue kept busy."""
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def bench_shape(dtype, head_dim, causal, seqlen, tokens, heads, impls, warmup, runs,
                interleave=False, order="shuffle"):
    batch = max(1, tokens // seqlen)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, dtype=dtype, device="cuda")
               for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA wants (B, H, L, D)
    fns, kernels = {}, {}
    for impl in impls:
        if impl == "fa3":
            import flash_attn_interface

            def fn():
                return flash_attn_interface.flash_attn_func(q, k, v, causal=causal)  # noqa: F821  (bound before the del below)
        elif impl.startswith("kforge"):
            path = impl.partition(":")[2]

            def fn(path=path):
                if path:  # read by the library at every call
                    os.environ["KFORGE_FMHA_SM90_PATH"] = path
                return kforge_fmha.fmha_fwd(q, k, v, causal=causal)  # noqa: F821  (bound before the del below)
            fn()
            kernels[impl] = kforge_fmha.last_kernel() if hasattr(kforge_fmha, "last_kernel") else None
        else:
            def fn(backend=BACKENDS[impl]):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: F821  (bound before the del below)
        fns[impl] = fn
    if interleave:
        timed = time_interleaved(fns, warmup, runs, order, shape_seed(dtype, head_dim, causal, seqlen))
    else:  # one column's runs after another's
        timed = {}
        for impl, fn in fns.items():
            try:
                timed[impl] = time_ms(fn, warmup, runs)
            except RuntimeError as exc:  # backend refuses this shape
                timed[impl] = str(exc).splitlines()[0][:80]
    fl = flops(batch, heads, seqlen, head_dim, causal)
    res = {}
    for impl in impls:
        t = timed[impl]
        res[impl] = ({"ms": None, "tflops": None, "error": t} if isinstance(t, str)
                     else {"ms": t, "tflops": fl / t / 1e9})
        if kernels.get(impl) is not None:
            res[impl]["kernel"] = kernels[impl]
    del fns, q, k, v, qt, kt, vt
    return {"dtype": str(dtype).replace("torch.", ""), "head_dim": head_dim, "causal": causal,
            "seqlen": seqlen, "batch": batch, "heads": heads, "results": res}


def peak_memory(seqlens, heads, head_dim, dtype):
    rows = []
    for seqlen in seqlens:
        q, k, v = (torch.randn(1, seqlen, heads, head_dim, dtype=dtype, device="cuda")
                   for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out, lse = kforge_fmha.fmha_fwd(q, k, v, causal=True, return_lse=True)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        out_bytes = out.numel() * out.element_size() + lse.numel() * lse.element_size()
        rows.append({"seqlen": seqlen, "peak_extra_bytes": extra, "out_plus_lse_bytes": out_bytes,
                     "scores_matrix_bytes_if_materialised": heads * seqlen * seqlen * 4})
        del q, k, v, out, lse
    return rows


def fmt(x, nd=0):
    return "n/a" if x is None else f"{x:.{nd}f}"


def render(meta, rows, mem) -> str:
    lines = [HEADING, "", BEGIN, ""]
    lines.append(f"Device: **{meta['device']}** ({meta['sms']} SMs); torch {meta['torch']}, "
                 f"CUDA {meta['cuda']}, cuDNN {meta['cudnn']}; kforge_fmha {meta['kforge']} "
                 f"built for {meta['archs']}; {meta['date']}.")
    lines.append("")
    how = ("that rotates by one each round" if meta.get("order") == "rotate" else
           "drawn at random for each block of as many rounds as columns and rotated by one per round "
           "inside it (every column takes every place once per block; the column before it varies), "
           "each round queued behind a short GPU sleep so that no call is timed with its launch cost")
    timing = ("in rounds: each round times every column's kernel once, in an order " + how +
              ", so a GPU clock drift is spread over all columns"
              if meta.get("interleave") else
              "calls queued back to back with no sync between them, one column after another")
    lines.append(f"Forward pass, TFLOP/s (median of {meta['runs']} runs after {meta['warmup']} "
                 f"warm-ups; CUDA events around each call, {timing}), {meta['heads']} heads, batch × seqlen = "
                 f"{meta['tokens']} tokens, FLOPs = 4·B·H·L²·d (halved when causal). Ratios are "
                 "kforge_fmha / SDPA backend, from the same run. Produced by "
                 f"`{meta.get('command', 'python benchmarks/fmha_vs_sdpa.py --write docs/benchmarks.md')}`. "
                 f"Host time per call (tiny shape, queue busy): kforge_fmha "
                 f"{meta['host_us_kforge']:.0f} µs (Python checks, torch allocations, ctypes, C-side pointer checks), "
                 f"SDPA {meta['host_us_sdpa']:.0f} µs.")
    lines.append("")
    ours_impls = [k for k in (rows[0]["results"] if rows else {}) if k.startswith("kforge")]
    paths = len(ours_impls) > 1 or any(":" in k for k in ours_impls)
    fa3 = any("fa3" in r["results"] for r in rows)
    head = "| dtype | hdim | causal | seqlen | batch | "
    head += "path | kernel | kforge |" if paths else "kforge |"
    head += " SDPA flash | SDPA efficient | SDPA cuDNN |" + (" FA3 |" if fa3 else "")
    lines.append(head + " × flash | × cuDNN |" + (" × FA3 |" if fa3 else ""))
    lines.append("|---" * ((13 if paths else 11) + (2 if fa3 else 0)) + "|")
    for r in rows:
        t = {k: v.get("tflops") for k, v in r["results"].items()}
        for impl in ours_impls:
            ours = t.get(impl)
            ratio_f = ours / t["flash"] if ours and t.get("flash") else None
            ratio_c = ours / t["cudnn"] if ours and t.get("cudnn") else None
            ratio_3 = ours / t["fa3"] if ours and t.get("fa3") else None
            path_cols = ""
            if paths:
                kernel = r["results"][impl].get("kernel", "?")
                path_cols = f"{impl.partition(':')[2] or 'default'} | {kernel} | "
            lines.append(
                f"| {r['dtype']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} "
                f"| {r['batch']} | {path_cols}{fmt(ours)} | {fmt(t.get('flash'))} "
                f"| {fmt(t.get('efficient'))} | {fmt(t.get('cudnn'))} | "
                + (f"{fmt(t.get('fa3'))} | " if fa3 else "")
                + f"{fmt(ratio_f, 2)} | {fmt(ratio_c, 2)} |" + (f" {fmt(ratio_3, 2)} |" if fa3 else ""))
    bar = [(r, impl) for r in rows for impl in ours_impls[:1]
           if r["dtype"] == "bfloat16" and r["head_dim"] == 128
           and r["seqlen"] >= 2048 and r["results"].get(impl, {}).get("tflops")
           and r["results"].get("flash", {}).get("tflops")]
    if bar:
        worst = min(r["results"][impl]["tflops"] / r["results"]["flash"]["tflops"]
                    for r, impl in bar)
        lines.append("")
        first = ours_impls[0].partition(":")[2] or "default"
        lines.append(f"**The bar** (bf16, hdim 128, seqlen ≥ 2k, causal and not: ≥ 1.0× SDPA "
                     f"flash; path {first}): lowest ratio in this run = **{worst:.2f}×** "
                     f"→ {'met' if worst >= 1.0 else 'NOT met'}.")
    if paths and any(r["results"].get("cudnn", {}).get("tflops") for r in rows):
        lines.extend(best_path_summary(rows, ours_impls))
    if mem:
        lines.append("")
        lines.append(f"Peak extra GPU memory of one kforge_fmha call (bf16, causal, batch 1, "
                     f"{meta['heads']} heads, hdim 128, inputs already allocated; "
                     "`torch.cuda.max_memory_allocated`). It is the output plus the LSE, so it "
                     "grows linearly with seqlen; an L² score matrix would be the last column:")
        lines.append("")
        lines.append("| seqlen | peak extra | output + lse | bytes/token | fp32 L² scores (not allocated) |")
        lines.append("|---|---|---|---|---|")
        for m in mem:
            lines.append(f"| {m['seqlen']} | {m['peak_extra_bytes'] / 2**20:.1f} MiB "
                         f"| {m['out_plus_lse_bytes'] / 2**20:.1f} MiB "
                         f"| {m['peak_extra_bytes'] / m['seqlen']:.0f} "
                         f"| {m['scores_matrix_bytes_if_materialised'] / 2**20:.0f} MiB |")
    lines += ["", END, ""]
    return "\n".join(lines)


def best_path_summary(rows, ours_impls) -> list[str]:
    """Per shape, the fastest kforge path against SDPA cuDNN; per path, its lowest × cuDNN and
    issue 18's bar (hdim 128 at seqlen >= 2k: >= 1.0× cuDNN at every point; hdim 64: >= 0.9×)."""
    lines = ["", "Fastest kforge path per shape (same run):", "",
             "| dtype | hdim | causal | seqlen | best path | kforge | SDPA cuDNN | × cuDNN | runner-up |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cud = r["results"].get("cudnn", {}).get("tflops")
        got = sorted(((r["results"][i]["tflops"], i.partition(":")[2] or "default")
                      for i in ours_impls if r["results"].get(i, {}).get("tflops")), reverse=True)
        if not got:
            continue
        runner = f"{got[1][1]} ({got[1][0]:.0f})" if len(got) > 1 else "—"
        lines.append(f"| {r['dtype']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} "
                     f"| {r['seqlen']} | {got[0][1]} | {got[0][0]:.0f} | {fmt(cud)} "
                     f"| {fmt(got[0][0] / cud if cud else None, 2)} | {runner} |")
    lines += ["", "Per path, the lowest × cuDNN over seqlen ≥ 2k, both dtypes and masks (issue 18's "
              "bar: hdim 128 ≥ 1.00 at every point, hdim 64 ≥ 0.90):", "",
              "| path | hdim 128 lowest × cuDNN | hdim 128 bar | hdim 64 lowest × cuDNN | hdim 64 bar |",
              "|---|---|---|---|---|"]
    for impl in ours_impls:
        cols = []
        for hd, need in ((128, 1.0), (64, 0.9)):
            ratios = [r["results"][impl]["tflops"] / r["results"]["cudnn"]["tflops"] for r in rows
                      if r["head_dim"] == hd and r["seqlen"] >= 2048
                      and r["results"].get(impl, {}).get("tflops")
                      and r["results"].get("cudnn", {}).get("tflops")]
            low = min(ratios) if ratios else None
            cols += [fmt(low, 2), "—" if low is None else ("met" if low >= need else "not met")]
        lines.append(f"| {impl.partition(':')[2] or 'default'} | " + " | ".join(cols) + " |")
    return lines


class WriteRefused(Exception):
    """--write found a section it cannot update without losing text."""


def write_section(path: Path, section: str) -> None:
    """Puts the generated part of `section` (from BEGIN to END) in place of the one in `path`,
    keeping everything else; a file without the heading gets the whole section appended. A
    heading without both markers is refused: replacing its section would drop whatever was
    written under it by hand."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    generated = section[section.index(BEGIN):section.index(END) + len(END)]
    has_heading = re.search(rf"^{re.escape(HEADING)}$", text, re.M) is not None
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        text = text[:text.index(BEGIN)] + generated + text[text.index(END) + len(END):]
    elif has_heading:
        raise WriteRefused(
            f"{path} has a '{HEADING}' section without the lines {BEGIN!r} and {END!r} around "
            "its generated table, so --write cannot tell the table from the text written under "
            "it by hand and would lose that text. Nothing was written. Put those two lines "
            "around the table (or remove the section) and run again, or write to another file.")
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="bf16 only, kforge only")
    ap.add_argument("--write", type=Path, help="markdown file to put the table in")
    ap.add_argument("--json", type=Path, help="also dump raw results as JSON")
    ap.add_argument("--paths", default="",
                    help="comma list of sm_90a kernel paths to run kforge_fmha with "
                         "(KFORGE_FMHA_SM90_PATH: kforge_fmha.sm90_paths(), the rows of "
                         "kernels/fmha/csrc/fmha_paths.def; the tuning paths need a build with "
                         "-DKFORGE_FMHA_TUNING_PATHS=ON); "
                         "default: the library's default only")
    ap.add_argument("--interleave", action="store_true",
                    help="time all columns of a shape in rounds (one call each per round) "
                         "instead of one column's runs after another's")
    ap.add_argument("--order", choices=("shuffle", "rotate"), default="shuffle",
                    help="with --interleave: each round's column order, random per block of rounds "
                         "(default) or the list rotated by one per round (runs up to 26)")
    ap.add_argument("--fa3", action="store_true",
                    help="add FlashAttention-3 (flash_attn_interface, the flash-attn3 wheel) as a column")
    ap.add_argument("--head-dims", default="128,64", help="comma list (default 128,64)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory table")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark", file=sys.stderr)
        return 2
    seqlens = [int(s) for s in args.seqlens.split(",")]
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float16]
    ours = [f"kforge:{p}" for p in args.paths.split(",") if p] or ["kforge"]
    impls = ours if args.quick else ours + ["flash", "efficient", "cudnn"]
    if args.fa3:
        try:
            import flash_attn_interface  # noqa: F401
        except ImportError as exc:
            print(f"--fa3: FlashAttention-3 is not importable here ({exc}). Build and install its wheel "
                  "(nox -s build-flash-attn3-sm90, then pip install it from the wheelhouse), or drop --fa3.",
                  file=sys.stderr)
            return 2
        impls.append("fa3")
    head_dims = [int(d) for d in args.head_dims.split(",")]
    props = torch.cuda.get_device_properties(0)
    meta = {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "kforge": kforge_fmha.__version__,
            "archs": " ".join(kforge_fmha.built_archs()), "tokens": args.tokens,
            "heads": args.heads, "runs": args.runs, "warmup": args.warmup,
            "interleave": args.interleave,
            "order": args.order,
            "command": " ".join(["python", "benchmarks/fmha_vs_sdpa.py", *(sys.argv[1:] if argv is None else argv)]),
            "python": platform.python_version(), "paths": args.paths,
            "date": __import__("datetime").datetime.now(__import__("datetime").timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC")}
    q = torch.randn(1, 128, args.heads, 128, dtype=torch.bfloat16, device="cuda")
    meta["host_us_kforge"] = host_us(lambda: kforge_fmha.fmha_fwd(q, q, q))  # noqa: F821  (bound before the del below)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        qt = q.transpose(1, 2)
        meta["host_us_sdpa"] = host_us(lambda: F.scaled_dot_product_attention(qt, qt, qt))  # noqa: F821  (bound before the del below)
    del q, qt
    print(f"host time per call: kforge {meta['host_us_kforge']:.1f} us, "
          f"SDPA flash {meta['host_us_sdpa']:.1f} us", flush=True)
    rows = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                for seqlen in seqlens:
                    r = bench_shape(dtype, head_dim, causal, seqlen, args.tokens, args.heads, impls,
                                    args.warmup, args.runs, interleave=args.interleave,
                                    order=args.order)
                    rows.append(r)
                    t = {k: fmt(v.get("tflops")) for k, v in r["results"].items()}
                    print(f"{r['dtype']:9s} d={head_dim:3d} causal={int(causal)} L={seqlen:5d} "
                          + " ".join(f"{k}={v}" for k, v in t.items()), flush=True)
    mem = [] if args.quick or args.no_memory else peak_memory([1024, 4096, 16384, 65536], args.heads, 128,
                                            torch.bfloat16)
    section = render(meta, rows, mem)
    print(section)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "memory": mem}, indent=1))
    if args.write:
        try:
            write_section(args.write, section)
        except WriteRefused as exc:
            print(f"fmha_vs_sdpa.py: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
