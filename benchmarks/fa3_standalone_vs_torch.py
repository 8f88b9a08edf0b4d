"""flash_attn_standalone (FlashAttention-3's forward kernels as a C library, called through its ctypes
binding) against FlashAttention-3's torch wheel (flash_attn_interface), in one process, on the
same tensors.

Device time: bf16, hdim 128, --heads heads, batch x seqlen = --tokens, seqlen 2k to 16k, causal
and not. The two columns are timed in interleaved rounds (timing.time_interleaved: CUDA events
around each call, the column order drawn per block of rounds, each round behind a GPU sleep);
each column's time is the median over the rounds, TFLOP/s divide FLOPs = 4·B·H·L²·d (halved when
causal), and the ratio is standalone / FA3 from the same run. Both get the same num_splits
(--num-splits; FA3's flash_attn_func defaults to 1), so the two libraries' heuristics cannot pick
different work.

Same work: before timing a shape, its two outputs are compared (max |standalone - FA3|); a shape
where they differ by more than --max-diff gets no ratio, and the run exits 1.

Host cost per call: the CPU clock (perf_counter) around each of --host-calls back-to-back calls
on a tiny shape (batch 1, seqlen 128, causal off), columns in blocks that alternate their order
over --host-rounds rounds; the median over all calls. Columns: flash_attn_standalone's
flash_attn_func on torch's default stream in each stream mode ("side": its own stream, ordered
by events; "legacy": the default stream through cudaStreamLegacy) and on a stream of the caller's;
FA3's flash_attn_interface.flash_attn_func; and fa3s_fwd itself through ctypes with an args
struct and workspace built once (what any binding costs at the least), the same with a NULL
workspace (the library allocates it on the stream), and fa3s_fwd_workspace_size alone.

    python benchmarks/fa3_standalone_vs_torch.py --out docs/benchmarks/fa3-standalone
    python benchmarks/fa3_standalone_vs_torch.py --standalone-only   # without the FA3 wheel

--out STEM writes STEM.md (the tables) and STEM.json (every number, with the run's facts).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import flops, shape_seed, time_interleaved  # noqa: E402

OURS, FA3 = "standalone", "fa3"
HOST_SHAPE = (1, 128)  # batch, seqlen of the host-cost calls


# --- pure parts: rows, summaries, the report -------------------------------------------------------


def make_row(shape: dict, timed: dict, diff: float | None, max_diff: float) -> dict:
    """One shape's result. timed: column -> median ms, or the column's error string; diff: max
    |standalone - FA3| over the outputs (None without an FA3 column). The ratio (standalone TFLOP/s
    over FA3's) is given only when both ran and their outputs agree within max_diff."""
    fl = flops(shape["batch"], shape["heads"], shape["seqlen"], shape["head_dim"], shape["causal"])
    results = {}
    for name, t in timed.items():
        results[name] = ({"ms": None, "tflops": None, "error": t} if isinstance(t, str)
                         else {"ms": t, "tflops": fl / t / 1e9})
    same = None if diff is None else bool(diff <= max_diff)
    ours, theirs = (results.get(n, {}).get("tflops") for n in (OURS, FA3))
    ratio = ours / theirs if same and ours and theirs else None
    return {**shape, "flops": fl, "results": results, "max_abs_diff": diff, "same_work": same, "ratio": ratio}


def summarize_host(samples: dict) -> dict:
    """Per column: median, mean and minimum of its per-call CPU times (seconds in, microseconds out)."""
    out = {}
    for name, times in samples.items():
        if not times:
            out[name] = {"calls": 0, "median_us": None, "mean_us": None, "min_us": None}
            continue
        out[name] = {"calls": len(times), "median_us": statistics.median(times) * 1e6,
                     "mean_us": statistics.fmean(times) * 1e6, "min_us": min(times) * 1e6}
    return out


def _fmt(x, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _diff(x) -> str:
    return "n/a" if x is None else ("0" if x == 0 else f"{x:.2g}")


def render(meta: dict, rows: list[dict], host: dict) -> str:
    lines = ["## flash_attn_standalone vs FlashAttention-3 (torch wheel)", ""]
    lines.append(f"Device: **{meta['device']}** ({meta['sms']} SMs, host kernel {meta.get('kernel', '?')}); "
                 f"torch {meta['torch']}, CUDA {meta['cuda']}; "
                 f"flash_attn_standalone profile {meta['profile']} ({meta['archs']}); FA3 wheel "
                 f"{meta.get('fa3_version') or 'not run'}; {meta['date']}.")
    lines.append("")
    lines.append(f"Forward pass, bf16, hdim {meta['head_dim']}, {meta['heads']} heads, batch × seqlen = "
                 f"{meta['tokens']} tokens, num_splits={meta['num_splits']} for both. TFLOP/s from CUDA events, "
                 f"median of {meta['runs']} interleaved rounds after {meta['warmup']} warm-ups (FLOPs = 4·B·H·L²·d, "
                 "halved when causal). Ratio = standalone / FA3 in the same run, given only where the two "
                 f"outputs agree (max |Δ| ≤ {meta['max_diff']}). Produced by `{meta['command']}`.")
    lines.append("")
    lines.append("| causal | seqlen | batch | standalone | FA3 | ratio | max abs diff |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        t = {k: v.get("tflops") for k, v in r["results"].items()}
        if r["same_work"] is False:
            ratio = "n/a (outputs differ)"
        else:
            ratio = _fmt(r["ratio"], 3)
        lines.append(f"| {'yes' if r['causal'] else 'no'} | {r['seqlen']} | {r['batch']} | {_fmt(t.get(OURS))} "
                     f"| {_fmt(t.get(FA3))} | {ratio} | {_diff(r['max_abs_diff'])} |")
    errors = [(r, name, res["error"]) for r in rows for name, res in r["results"].items() if res.get("error")]
    if errors:
        lines.append("")
        for r, name, err in errors:
            lines.append(f"- {name}, seqlen {r['seqlen']}, causal {r['causal']}: {err}")
    if host:
        b, s = HOST_SHAPE
        lines.append("")
        lines.append(f"Host time per call (batch {b}, seqlen {s}, {meta['heads']} heads, hdim {meta['head_dim']}, "
                     "bf16; CPU clock around each back-to-back call):")
        lines.append("")
        lines.append("| call | median µs | mean µs | min µs | calls |")
        lines.append("|---|---|---|---|---|")
        for name, h in host.items():
            lines.append(f"| {name} | {_fmt(h['median_us'], 1)} | {_fmt(h['mean_us'], 1)} | "
                         f"{_fmt(h['min_us'], 1)} | {h['calls']} |")
    return "\n".join(lines) + "\n"


def write_outputs(stem: Path, meta: dict, rows: list[dict], host: dict) -> tuple[Path, Path]:
    """STEM.md (the report) and STEM.json (meta, rows, host), written whole or not at all."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    md, js = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".json")
    for path, text in ((md, render(meta, rows, host)),
                       (js, json.dumps({"meta": meta, "rows": rows, "host": host}, indent=1) + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return md, js


# --- measuring -------------------------------------------------------------------------------------


def _first(result):
    """FA3's flash_attn_func returns out, or (out, lse, ...) in some versions."""
    return result[0] if isinstance(result, tuple) else result


def bench_shape(fas, fa3, seqlen: int, causal: bool, args) -> dict:
    batch = max(1, args.tokens // seqlen)
    shape = {"dtype": "bfloat16", "head_dim": args.head_dim, "heads": args.heads, "seqlen": seqlen,
             "batch": batch, "causal": causal}
    q, k, v = (torch.randn(batch, seqlen, args.heads, args.head_dim, dtype=torch.bfloat16, device="cuda")
               for _ in range(3))

    def ours():
        return fas.flash_attn_func(q, k, v, causal=causal, num_splits=args.num_splits)

    def theirs():
        return _first(fa3.flash_attn_func(q, k, v, causal=causal, num_splits=args.num_splits))

    fns = {OURS: ours}
    diff = None
    if fa3 is not None:
        fns[FA3] = theirs
        try:
            diff = (ours().float() - theirs().float()).abs().max().item()
        except RuntimeError as exc:  # one side refuses the shape: time_interleaved records which
            print(f"seqlen {seqlen} causal {causal}: no comparison: {exc}", file=sys.stderr)
    timed = time_interleaved(fns, args.warmup, args.runs, args.order, shape_seed("fa3s", seqlen, causal))
    return make_row(shape, timed, diff, args.max_diff)


def raw_call(fas, q, out, workspace: str = "given"):
    """fa3s_fwd through ctypes with everything built once: the args struct, its pointer, the
    workspace and the stream (the current one, or cudaStreamLegacy for torch's default).
    workspace "given": a buffer of fa3s_fwd_workspace_size bytes, made once; "null": NULL, so
    the library allocates it on the stream every call; "size": the call is
    fa3s_fwd_workspace_size alone (what asking for the size costs)."""
    args = fas.fwd_args()
    b, s, h, d = q.shape
    args.dtype = int(fas.DType.BF16)
    args.batch, args.seqlen_q, args.seqlen_k, args.num_heads, args.num_heads_k, args.head_dim = b, s, s, h, h, d
    args.q = args.k = args.v = q.data_ptr()
    args.out = out.data_ptr()
    nbytes = fas.workspace_size(args)
    workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    ws_ptr = workspace.data_ptr() if nbytes else None
    stream = torch.cuda.current_stream().cuda_stream or fas.CUDA_STREAM_LEGACY
    ref, lib = ctypes.byref(args), fas.library()
    fwd, size_of = lib.fa3s_fwd, lib.fa3s_fwd_workspace_size
    if workspace == "null":
        ws_ptr, nbytes = None, 0
    size = ctypes.c_size_t(0)
    size_ref = ctypes.byref(size)

    def call():
        status = size_of(ref, size_ref) if workspace == "size" else fwd(ref, ws_ptr, nbytes, stream)
        if status:
            raise fas.FA3SError(status, fas.last_error())

    call.keep = (args, workspace, out)  # what the struct points at stays alive
    return call


@contextlib.contextmanager
def _stream_mode(fas, mode: str):
    before = fas.set_default_stream_mode(mode)
    try:
        yield
    finally:
        fas.set_default_stream_mode(before)


def host_columns(fas, fa3, heads: int, head_dim: int) -> dict:
    """name -> (context factory, call) for the host-cost table."""
    b, s = HOST_SHAPE
    q = torch.randn(b, s, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    user = torch.cuda.Stream()
    cols = {
        "standalone flash_attn_func, default stream, mode side": (
            lambda: _stream_mode(fas, "side"), lambda: fas.flash_attn_func(q, q, q)),
        "standalone flash_attn_func, default stream, mode legacy": (
            lambda: _stream_mode(fas, "legacy"), lambda: fas.flash_attn_func(q, q, q)),
        "standalone flash_attn_func, caller's stream": (
            lambda: torch.cuda.stream(user), lambda: fas.flash_attn_func(q, q, q)),
        "fa3s_fwd through ctypes, args and workspace built once": (
            contextlib.nullcontext, raw_call(fas, q, torch.empty_like(q))),
        "fa3s_fwd through ctypes, args built once, workspace NULL": (
            contextlib.nullcontext, raw_call(fas, q, torch.empty_like(q), "null")),
        "fa3s_fwd_workspace_size through ctypes": (
            contextlib.nullcontext, raw_call(fas, q, torch.empty_like(q), "size")),
    }
    if fa3 is not None:
        cols["FA3 flash_attn_interface.flash_attn_func"] = (
            contextlib.nullcontext, lambda: fa3.flash_attn_func(q, q, q))
    return cols


def host_times(columns: dict, calls: int, rounds: int) -> dict:
    """Per column, the CPU time of each call: blocks of `calls` back-to-back calls, the columns'
    order reversed every other round."""
    samples = {name: [] for name in columns}
    for r in range(rounds):
        order = list(columns) if r % 2 == 0 else list(reversed(columns))
        for name in order:
            context, fn = columns[name]
            with context():
                fn()
                torch.cuda.synchronize()
                times = samples[name]
                for _ in range(calls):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                torch.cuda.synchronize()
    return samples


def _fa3_version(fa3) -> str | None:
    if fa3 is None:
        return None
    from importlib import metadata

    for dist in ("flash_attn_3", "flash-attn-3", "flash_attn3", "flash-attn3"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return getattr(fa3, "__version__", "unknown version")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlens", default="2048,4096,8192,16384")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30, help="interleaved rounds per shape")
    ap.add_argument("--order", choices=("shuffle", "rotate"), default="shuffle")
    ap.add_argument("--num-splits", type=int, default=1, help="passed to both (FA3's flash_attn_func default: 1)")
    ap.add_argument("--max-diff", type=float, default=2e-2,
                    help="largest max |standalone - FA3| that still counts as the same work")
    ap.add_argument("--host-calls", type=int, default=300, help="calls per column and round")
    ap.add_argument("--host-rounds", type=int, default=4)
    ap.add_argument("--standalone-only", action="store_true", help="no FA3 column (no flash_attn_interface)")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fa3_standalone_vs_torch.py: no CUDA GPU: nothing to benchmark", file=sys.stderr)
        return 2
    try:
        import flash_attn_standalone as fas

        info = fas.build_info()
    except (ImportError, OSError) as exc:
        print(f"fa3_standalone_vs_torch.py: flash_attn_standalone is not usable here ({exc}). Install its wheel "
              "(or set FA3S_LIBRARY to a built libflash_attn_standalone.so).", file=sys.stderr)
        return 2
    fa3 = None
    if not args.standalone_only:
        try:
            import flash_attn_interface as fa3
        except ImportError as exc:
            print(f"fa3_standalone_vs_torch.py: FlashAttention-3's torch wheel is not importable ({exc}). Build "
                  "and install it (nox -s build-flash-attn3-sm90, then pip install it from the wheelhouse), or "
                  "pass --standalone-only.", file=sys.stderr)
            return 2
    props = torch.cuda.get_device_properties(0)
    meta = {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "profile": info["profile"], "archs": info["archs"],
            "fa3_version": _fa3_version(fa3), "stream_mode": fas.default_stream_mode(),
            "tokens": args.tokens, "heads": args.heads, "head_dim": args.head_dim, "runs": args.runs,
            "warmup": args.warmup, "order": args.order, "num_splits": args.num_splits,
            "max_diff": args.max_diff, "python": platform.python_version(), "kernel": platform.release(),
            "command": " ".join(["python", "benchmarks/fa3_standalone_vs_torch.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    host = summarize_host(host_times(host_columns(fas, fa3, args.heads, args.head_dim), args.host_calls,
                                     args.host_rounds))
    for name, h in host.items():
        print(f"host: {name}: median {_fmt(h['median_us'], 1)} us", flush=True)
    rows = []
    for causal in (False, True):
        for seqlen in (int(s) for s in args.seqlens.split(",")):
            row = bench_shape(fas, fa3, seqlen, causal, args)
            rows.append(row)
            t = {k: _fmt(v.get("tflops")) for k, v in row["results"].items()}
            print(f"causal={int(causal)} L={seqlen:5d} " + " ".join(f"{k}={v}" for k, v in t.items())
                  + f" ratio={_fmt(row['ratio'], 3)} diff={_diff(row['max_abs_diff'])}", flush=True)
    report = render(meta, rows, host)
    print(report)
    if args.out:
        for path in write_outputs(args.out, meta, rows, host):
            print(f"wrote {path}")
    differ = [r for r in rows if r["same_work"] is False]
    if differ:
        print("fa3_standalone_vs_torch.py: the two libraries' outputs differ beyond --max-diff at "
              + ", ".join(f"seqlen {r['seqlen']} causal {r['causal']} ({r['max_abs_diff']:.3g})" for r in differ)
              + "; those ratios compare different work and were left out.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
