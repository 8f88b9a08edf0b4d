"""kforge_fmha's attention backward, and forward + backward, against SDPA (flash and cuDNN
backends), the FlashAttention-2 wheel (flash_attn) and FlashAttention-3 (flash_attn_interface), in
one process, on the same tensors.

What is timed, per column: "bwd", the backward alone: the forward runs once with autograd and
each timed call is torch.autograd.grad(out, (q, k, v), dout, retain_graph=True); "fwd+bwd", the
forward and that backward; "fwd" (not in the default --modes), the forward alone under
torch.no_grad() (an A/B of forward builds: KFORGE_FMHA_LIBRARY at each, --modes fwd). kforge runs kforge_fmha.attention (its backward kernels through the C
API: preprocess, main, convert, the workspace from torch's allocator); SDPA runs
F.scaled_dot_product_attention under torch.nn.attention.sdpa_kernel(FLASH_ATTENTION or
CUDNN_ATTENTION) on (B, H, L, D) views of the same tensors; FA2 and FA3 their flash_attn_func.
Every column goes through torch autograd, so the engine's cost is the same for all.

Columns are timed in interleaved rounds (benchmarks/timing.py's time_interleaved: CUDA events
around each call, the column order drawn per block of rounds, each round behind a GPU sleep), the
median over --runs rounds. TFLOP/s: the forward's FLOPs are 2·B·H·L²·(d_qk + d_v) (4·B·H·L²·d at
d_qk = d_v), halved when causal; the backward counts 2.5x them, fwd+bwd 3.5x, fwd 1x. Each column's FLOPs
are its own head dims: at (192, 128), FA2, FA3 and SDPA flash (FlashAttention-2's kernel, which
needs d_qk = d_v) run (192, 192) (--fa-192-dv), so their TFLOP/s count the larger P·V; the ratio kforge / column is of TFLOP/s (= the time ratio at equal dims).

Same work: before timing, each column's dq, dk, dv are compared with kforge's (max |Δ| over
max |kforge's|); a column over --max-diff gets no ratio, and the run exits 1. Columns with other
head dims are not compared. Shapes: batch × seqlen = --tokens, heads = 2048 // d_v unless --heads.

    python benchmarks/fmha_bwd.py --out docs/benchmarks/fmha-bwd
    python benchmarks/fmha_bwd.py --pairs 128x128 --dtypes bf16 --modes bwd   # a subset

--out STEM writes STEM.md (the tables) and STEM.json (every number, with the run's facts).
Needs a CUDA GPU, torch and kforge_fmha with the backward (KFORGE_FMHA_LIBRARY may point at a
build); flash_attn and flash_attn_interface are optional (their columns say "not installed").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import shape_seed, time_interleaved  # noqa: E402

OURS = "kforge"
COLUMNS = ("kforge", "kforge-portable", "sdpa-flash", "sdpa-cudnn", "fa2", "fa3")
# kforge-portable: kforge_fmha with its backward forced onto the mma.sync kernels
# (KFORGE_FMHA_BWD_PATH=portable while its backward runs; the C API reads it at every call), so the
# sm_90a and the portable backward are timed in the same process on the same tensors.
PORTABLE = "kforge-portable"
MODES = ("bwd", "fwd+bwd", "fwd")
MODE_FACTOR = {"bwd": 2.5, "fwd+bwd": 3.5, "fwd": 1.0}  # times the forward's FLOPs
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HIDDEN = 2048  # heads = HIDDEN // d_v, FlashAttention's benchmark convention


# --- pure parts: shapes, FLOPs, rows, the report ---------------------------------------------------


def attention_flops(batch: int, heads: int, seqlen: int, d_qk: int, d_v: int, causal: bool) -> float:
    """The forward's FLOPs: Q·Kᵀ (2·L²·d_qk) and P·V (2·L²·d_v) per (batch, head), halved when
    causal. At d_qk == d_v it is timing.flops (4·B·H·L²·d)."""
    f = 2.0 * batch * heads * seqlen * seqlen * (d_qk + d_v)
    return f / 2 if causal else f


def column_dims(column: str, d_qk: int, d_v: int, fa_192_dv: int = 192) -> tuple[int, int]:
    """(d_qk, d_v) a column runs at: FA2, FA3 and SDPA flash (FA2's kernel, d_qk = d_v only) run
    d_qk = 192 at (192, fa_192_dv)."""
    if column in ("fa2", "fa3", "sdpa-flash") and d_qk == 192 and d_v != d_qk:
        return d_qk, fa_192_dv
    return d_qk, d_v


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """"64x64,192x128" -> [(64, 64), (192, 128)]."""
    pairs = []
    for item in text.split(","):
        a, sep, b = item.strip().partition("x")
        if not sep or not a.isdigit() or not b.isdigit():
            raise ValueError(f"head-dim pair {item!r}: write d_qk x d_v, e.g. 128x128 or 192x128")
        pairs.append((int(a), int(b)))
    return pairs


def plan(dtypes: list[str], pairs: list[tuple[int, int]], seqlens: list[int], tokens: int,
         heads: int | None, causals: list[bool]) -> list[dict]:
    """Every shape to measure: batch × seqlen = tokens (at least 1), heads = HIDDEN // d_v."""
    shapes = []
    for dtype in dtypes:
        for d_qk, d_v in pairs:
            for causal in causals:
                for seqlen in seqlens:
                    shapes.append({"dtype": dtype, "d_qk": d_qk, "d_v": d_v,
                                   "heads": heads or max(1, HIDDEN // d_v), "seqlen": seqlen,
                                   "batch": max(1, tokens // seqlen), "causal": causal})
    return shapes


def make_row(shape: dict, mode: str, timed: dict, dims: dict, diffs: dict, max_diff: float,
             kernel: str | None = None) -> dict:
    """One (shape, mode) result. timed: column -> median ms or its error string; dims: column ->
    (d_qk, d_v) it ran; diffs: column -> max |Δ grads| relative to kforge's (None: not compared).
    ratio[column] = kforge TFLOP/s / the column's, given when both ran and, where compared, the
    gradients agree within max_diff."""
    factor = MODE_FACTOR[mode]
    results = {}
    for name, t in timed.items():
        d_qk, d_v = dims.get(name, (shape["d_qk"], shape["d_v"]))
        fl = factor * attention_flops(shape["batch"], shape["heads"], shape["seqlen"], d_qk, d_v,
                                      shape["causal"])
        if isinstance(t, str):
            results[name] = {"ms": None, "tflops": None, "error": t, "d_qk": d_qk, "d_v": d_v}
        else:
            results[name] = {"ms": t, "tflops": fl / t / 1e9, "d_qk": d_qk, "d_v": d_v}
    ours = results.get(OURS, {}).get("tflops")
    ratios, same = {}, {}
    for name, res in results.items():
        if name == OURS:
            continue
        diff = diffs.get(name)
        same[name] = None if diff is None else bool(diff <= max_diff)
        ok = ours and res.get("tflops") and same[name] is not False
        ratios[name] = ours / res["tflops"] if ok else None
    return {**shape, "mode": mode, "flops": factor * attention_flops(
                shape["batch"], shape["heads"], shape["seqlen"], shape["d_qk"], shape["d_v"],
                shape["causal"]),
            "kernel": kernel, "results": results, "max_rel_diff": dict(diffs), "same_work": same,
            "ratio": ratios}


def _fmt(x, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def render(meta: dict, rows: list[dict]) -> str:
    cols = [c for c in COLUMNS if any(c in r["results"] for r in rows)]
    others = [c for c in cols if c != OURS]
    lines = ["## fmha backward: kforge_fmha vs SDPA, FlashAttention-2 and FlashAttention-3", ""]
    lines.append(f"Device: **{meta['device']}** ({meta['sms']} SMs); torch {meta['torch']}, CUDA "
                 f"{meta['cuda']}, cuDNN {meta['cudnn']}; kforge_fmha {meta['kforge_fmha']} "
                 f"(archs {meta['archs']}, backward path {meta['bwd_path']}, forward "
                 f"{meta['fwd_path']}); flash_attn {meta.get('fa2_version') or 'not installed'}; "
                 f"flash_attn_interface (FA3) {meta.get('fa3_version') or 'not installed'}; "
                 f"{meta['date']}.")
    lines.append("")
    lines.append(f"TFLOP/s from CUDA events, median of {meta['runs']} interleaved rounds after "
                 f"{meta['warmup']} warm-ups; batch × seqlen = {meta['tokens']} tokens, heads = "
                 f"{meta['heads_rule']}. FLOPs: the forward's 2·B·H·L²·(d_qk + d_v), halved when "
                 "causal, times 2.5 (bwd: autograd.grad of a kept forward), 3.5 (fwd+bwd) or 1 (fwd: the "
                 "forward alone, no autograd graph). Ratio = "
                 "kforge / column in the same run (TFLOP/s), withheld where the gradients differ by "
                 f"more than {meta['max_diff']} of kforge's largest. At d_qk = 192, FA2, FA3 and SDPA "
                 f"flash run (192, {meta['fa_192_dv']}) and count their own FLOPs. Produced by `{meta['command']}`.")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["dtype"], r["d_qk"], r["d_v"]), []).append(r)
    for (mode, dtype, d_qk, d_v), group in groups.items():
        lines += ["", f"### {mode}, {dtype}, (d_qk, d_v) = ({d_qk}, {d_v}), {group[0]['heads']} heads", ""]
        # the portable backward against FlashAttention-2's kernel (SDPA flash, the FA2 wheel)
        port = [c for c in ("sdpa-flash", "fa2") if PORTABLE in cols and c in cols]
        head = (["causal", "seqlen", "batch"] + cols + [f"kforge/{c}" for c in others]
                + [f"{PORTABLE}/{c}" for c in port])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in group:
            cells = ["yes" if r["causal"] else "no", str(r["seqlen"]), str(r["batch"])]
            cells += [_fmt(r["results"].get(c, {}).get("tflops")) for c in cols]
            for c in others:
                if r["same_work"].get(c) is False:
                    cells.append(f"n/a (grads differ: {r['max_rel_diff'][c]:.2g})")
                else:
                    cells.append(_fmt(r["ratio"].get(c), 2))
            for c in port:
                a = r["results"].get(PORTABLE, {}).get("tflops")
                b = r["results"].get(c, {}).get("tflops")
                ok = a and b and r["same_work"].get(PORTABLE) is not False and r["same_work"].get(c) is not False
                cells.append(_fmt(a / b if ok else None, 2))
            lines.append("| " + " | ".join(cells) + " |")
    errors = [(r, c, res["error"]) for r in rows for c, res in r["results"].items() if res.get("error")]
    if errors:
        lines += ["", "Columns that did not run:", ""]
        seen = set()
        for r, c, err in errors:
            key = (c, r["dtype"], r["d_qk"], r["d_v"], err)
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- {c}, {r['dtype']} ({r['d_qk']}, {r['d_v']}), e.g. seqlen {r['seqlen']} "
                         f"causal {r['causal']} {r['mode']}: {err}")
    return "\n".join(lines) + "\n"


def write_outputs(stem: Path, meta: dict, rows: list[dict]) -> tuple[Path, Path]:
    """STEM.md (the report) and STEM.json (meta and rows), each written whole or not at all."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    md, js = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".json")
    for path, text in ((md, render(meta, rows)),
                       (js, json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return md, js


def rel_diff(ours: list, theirs: list) -> float:
    """max over the tensors of max |theirs - ours| / max |ours|."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        scale = a.float().abs().max().item() or 1.0
        worst = max(worst, (b.float() - a.float()).abs().max().item() / scale)
    return worst


# --- measuring -------------------------------------------------------------------------------------


def _first(result):
    """flash_attn_func returns out, or (out, lse, ...) in some versions."""
    return result[0] if isinstance(result, tuple) else result


def forward_fn(column: str, causal: bool, libs: dict):
    """column -> f(q, k, v) on (B, L, H, D) tensors, returning out as (B, L, H, D)."""
    if column in (OURS, PORTABLE):
        return lambda q, k, v: libs["kforge"].attention(q, k, v, causal=causal)
    if column in ("sdpa-flash", "sdpa-cudnn"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.FLASH_ATTENTION if column == "sdpa-flash" else SDPBackend.CUDNN_ATTENTION
        F = torch.nn.functional

        def sdpa(q, k, v):
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                     v.transpose(1, 2), is_causal=causal)
            return out.transpose(1, 2)
        return sdpa
    mod = libs[column]
    return lambda q, k, v: _first(mod.flash_attn_func(q, k, v, causal=causal))


class _BwdPath:
    """KFORGE_FMHA_BWD_PATH set to `value` inside the block (None: left as it is), restored after."""

    def __init__(self, value: str | None):
        self.value, self.saved = value, None

    def __enter__(self):
        if self.value is not None:
            self.saved = os.environ.get("KFORGE_FMHA_BWD_PATH")
            os.environ["KFORGE_FMHA_BWD_PATH"] = self.value

    def __exit__(self, *exc):
        if self.value is not None:
            if self.saved is None:
                os.environ.pop("KFORGE_FMHA_BWD_PATH", None)
            else:
                os.environ["KFORGE_FMHA_BWD_PATH"] = self.saved


def _path_of(column: str) -> str | None:
    return "portable" if column == PORTABLE else None


def bench_shape(shape: dict, modes: list[str], columns: list[str], libs: dict, args) -> list[dict]:
    dtype = DTYPES[shape["dtype"]]
    b, s, h, d_qk, d_v, causal = (shape[k] for k in ("batch", "seqlen", "heads", "d_qk", "d_v", "causal"))

    def leaf(d):
        return torch.randn(b, s, h, d, device="cuda", dtype=dtype).requires_grad_(True)

    q, k = leaf(d_qk), leaf(d_qk)  # one q and k for every column; v and dout per d_v
    per_dv: dict[int, tuple] = {}

    def inputs(dims):
        if dims[1] not in per_dv:
            per_dv[dims[1]] = (leaf(dims[1]), torch.randn(b, s, h, dims[1], device="cuda", dtype=dtype))
        return (q, k, *per_dv[dims[1]])

    dims = {c: column_dims(c, d_qk, d_v, args.fa_192_dv) for c in columns}
    grads, errors, kernel = {}, {}, None
    for c in columns:  # gradients once, for the same-work check (and to find refusals early)
        q, k, v, dout = inputs(dims[c])
        try:
            with _BwdPath(_path_of(c)):
                out = forward_fn(c, causal, libs)(q, k, v)
                ran = {}
                if c in (OURS, PORTABLE):
                    # the backward kernel: last_kernel() of the autograd thread, read in q's hook
                    ran["fwd"] = libs["kforge"].last_kernel()
                    hook = q.register_hook(lambda g, ran=ran: ran.__setitem__("bwd", libs["kforge"].last_kernel()))
                try:
                    grads[c] = torch.autograd.grad(out, (q, k, v), dout)
                finally:
                    if c in (OURS, PORTABLE):
                        hook.remove()
                if c in (OURS, PORTABLE):
                    kernel = ((kernel + "; ") if kernel else "") + f"{c}: {ran['fwd']} / {ran.get('bwd', '?')}"
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            errors[c] = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    diffs = {c: rel_diff(grads[OURS], grads[c]) for c in grads
             if c != OURS and OURS in grads and dims[c] == dims[OURS]}
    del grads
    rows = []
    for mode in modes:
        fns = {}
        for c in columns:
            if c in errors:
                continue
            q, k, v, dout = inputs(dims[c])
            fwd = forward_fn(c, causal, libs)
            path = _path_of(c)
            if mode == "fwd":
                def fn(fwd=fwd, q=q, k=k, v=v):
                    with torch.no_grad():
                        return fwd(q, k, v)
            elif mode == "bwd":
                out = fwd(q, k, v)

                def fn(out=out, q=q, k=k, v=v, dout=dout, path=path):
                    with _BwdPath(path):
                        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            else:
                def fn(fwd=fwd, q=q, k=k, v=v, dout=dout, path=path):
                    with _BwdPath(path):
                        return torch.autograd.grad(fwd(q, k, v), (q, k, v), dout)
            fns[c] = fn
        timed = time_interleaved(fns, args.warmup, args.runs, args.order,
                                 shape_seed("fmha_bwd", *shape.values(), mode)) if fns else {}
        timed.update(errors)
        rows.append(make_row(shape, mode, timed, dims, diffs, args.max_diff, kernel))
        del fns
    per_dv.clear()
    torch.cuda.empty_cache()
    return rows


def _version(module, *dists: str) -> str | None:
    if module is None:
        return None
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return getattr(module, "__version__", "unknown version")


def load_libs(columns: list[str]) -> tuple[dict, dict]:
    """The modules of the columns that need one, and a note per column that cannot run."""
    libs, missing = {}, {}
    import kforge_fmha

    libs["kforge"] = kforge_fmha
    if "fa2" in columns:
        try:
            import flash_attn

            libs["fa2"] = flash_attn
        except ImportError as exc:
            missing["fa2"] = f"flash_attn is not installed ({exc})"
    if "fa3" in columns:
        try:
            import flash_attn_interface

            libs["fa3"] = flash_attn_interface
        except ImportError as exc:
            missing["fa3"] = f"flash_attn_interface (FA3) is not installed ({exc})"
    return libs, missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--pairs", default="64x64,128x128,192x128", help="d_qk x d_v, comma-separated")
    ap.add_argument("--seqlens", default="2048,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    ap.add_argument("--heads", type=int, default=None, help=f"default {HIDDEN} // d_v")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--modes", default="bwd,fwd+bwd")
    ap.add_argument("--columns", default=",".join(COLUMNS))
    ap.add_argument("--fa-192-dv", type=int, default=192, help="d_v of FA2/FA3/SDPA flash in the d_qk = 192 case")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30, help="interleaved rounds per shape and mode")
    ap.add_argument("--order", choices=("shuffle", "rotate"), default="shuffle")
    ap.add_argument("--max-diff", type=float, default=0.05,
                    help="largest max |Δ grads| / max |kforge's| that still counts as the same work")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = ap.parse_args(argv)
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = sorted(set(columns) - set(COLUMNS)) + sorted(set(args.modes.split(",")) - set(MODES))
    if unknown or OURS not in columns:
        print(f"fmha_bwd.py: unknown column or mode {unknown}, or no kforge column; columns: "
              f"{', '.join(COLUMNS)}; modes: {', '.join(MODES)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("fmha_bwd.py: no CUDA GPU: nothing to benchmark", file=sys.stderr)
        return 2
    try:
        libs, missing = load_libs(columns)
    except ImportError as exc:
        print(f"fmha_bwd.py: kforge_fmha is not importable ({exc}); install kernels/fmha or put "
              "kernels/fmha/python on PYTHONPATH with KFORGE_FMHA_LIBRARY set", file=sys.stderr)
        return 2
    for c, why in missing.items():
        print(f"fmha_bwd.py: column {c} left out: {why}", file=sys.stderr)
    columns = [c for c in columns if c not in missing]
    kf = libs["kforge"]
    props = torch.cuda.get_device_properties(0)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    meta = {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "kforge_fmha": kf.library_version(),
            "library": str(kf.library_path()), "archs": " ".join(kf.built_archs()),
            "bwd_path": os.environ.get("KFORGE_FMHA_BWD_PATH") or "default (sm90 on an H100/H200 with a 90a build, else portable)",
            "fwd_path": ("portable (KFORGE_FMHA_SM90=0)" if os.environ.get("KFORGE_FMHA_SM90") == "0"
                         else os.environ.get("KFORGE_FMHA_SM90_PATH") or "default"),
            "fa2_version": _version(libs.get("fa2"), "flash_attn", "flash-attn"),
            "fa3_version": _version(libs.get("fa3"), "flash_attn_3", "flash-attn-3", "flash_attn3"),
            "missing": missing, "tokens": args.tokens,
            "heads_rule": f"{args.heads}" if args.heads else f"{HIDDEN} // d_v",
            "fa_192_dv": args.fa_192_dv, "runs": args.runs, "warmup": args.warmup,
            "order": args.order, "max_diff": args.max_diff, "python": platform.python_version(),
            "command": " ".join(["python", "benchmarks/fmha_bwd.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    shapes = plan(args.dtypes.split(","), parse_pairs(args.pairs),
                  [int(s) for s in args.seqlens.split(",")], args.tokens, args.heads, causals)
    rows = []
    for shape in shapes:
        for row in bench_shape(shape, args.modes.split(","), columns, libs, args):
            rows.append(row)
            t = {c: _fmt(r.get("tflops")) for c, r in row["results"].items()}
            print(f"{row['mode']:7s} {row['dtype']} ({row['d_qk']},{row['d_v']}) causal={int(row['causal'])} "
                  f"L={row['seqlen']:5d} " + " ".join(f"{c}={v}" for c, v in t.items())
                  + " " + " ".join(f"x{c}={_fmt(r, 2)}" for c, r in row["ratio"].items()), flush=True)
    print(render(meta, rows))
    if args.out:
        for path in write_outputs(args.out, meta, rows):
            print(f"wrote {path}")
    differ = [(r, c) for r in rows for c, same in r["same_work"].items() if same is False]
    if differ:
        print("fmha_bwd.py: gradients differ beyond --max-diff: " + ", ".join(
            f"{c} at {r['dtype']} ({r['d_qk']},{r['d_v']}) L={r['seqlen']} causal={r['causal']} "
            f"({r['max_rel_diff'][c]:.3g})" for r, c in differ) + "; those ratios were left out.",
            file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
