"""Smoke check of one sm_90a kernel path before the full GPU tests (a hang or a wrong answer shows
up here, in its own process, under a timeout): max error against an fp32 reference for a few
shapes per dtype, head dim and mask, and the kernel that ran (kforge_fmha.last_kernel).

    python kernels/fmha/scripts/tma_smoke.py --path tma      # exit 0: every case within tolerance

Exit 1 when a case is off or ran another kernel than the path asks for; exit 3 when a call
raises (a CUDA fault poisons the process, so the GPU script keeps such a path out of pytest).
"""

from __future__ import annotations

import argparse
import os
import sys

try:
    import torch
except ImportError as exc:  # exit 3, like any other error that is not a wrong answer
    print(f"tma_smoke.py needs torch: {exc}", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from tma_paths import ALL_PATHS  # noqa: E402  (csrc/fmha_paths.def; one table with tests/test_gpu.py)


def expected_kernel(kforge_fmha, path: str, head_dim: int, causal: bool, seqlen_k: int) -> str | None:
    """The kernel the library's table names for the call (None: wgmma, which the tests check)."""
    if path == "default":
        path = kforge_fmha.default_path(head_dim, causal, seqlen_k)
    return None if path == "wgmma" else kforge_fmha.path_kernel(path, head_dim)


TOL = {torch.float16: 1e-2, torch.bfloat16: 6e-2}  # the absolute caps of tests/test_gpu.py


def reference(q, k, v, causal: bool, scale: float):
    qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
    h, hk = q.shape[2], k.shape[2]
    kt = kt.repeat_interleave(h // hk, dim=1)
    vt = vt.repeat_interleave(h // hk, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", qt, kt) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(~(j <= i + (sk - sq)), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", p, vt).transpose(1, 2), lse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True, choices=sorted(ALL_PATHS))
    args = ap.parse_args(argv)
    os.environ["KFORGE_FMHA_SM90_PATH"] = args.path
    import kforge_fmha

    torch.manual_seed(0)
    bad = 0
    cases = [(1, 300, 300, 4, 4), (2, 1000, 1000, 4, 2), (1, 4097, 4097, 2, 2), (1, 64, 700, 2, 1),
             (1, 700, 300, 2, 2), (1, 1, 1, 2, 2), (3, 700, 700, 5, 5),
             (4, 2100, 2100, 8, 8)]
    for dtype in (torch.bfloat16, torch.float16):
        for head_dim in (128, 64):
            for causal in (False, True):
                if not kforge_fmha.path_built(args.path, head_dim, causal):
                    print(f"skip {args.path} d={head_dim} causal={int(causal)}: a tuning kernel this "
                          "library was built without (KFORGE_FMHA_TUNING_PATHS off)", flush=True)
                    continue
                for batch, sq, sk, h, hk in cases:
                    q = torch.randn(batch, sq, h, head_dim, dtype=dtype, device="cuda")
                    k = torch.randn(batch, sk, hk, head_dim, dtype=dtype, device="cuda")
                    v = torch.randn(batch, sk, hk, head_dim, dtype=dtype, device="cuda")
                    try:
                        out, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, return_lse=True)
                        ran = kforge_fmha.last_kernel()
                        torch.cuda.synchronize()
                    except (RuntimeError, kforge_fmha.FmhaError) as exc:
                        print(f"ERROR {args.path} {str(dtype)[6:]} d={head_dim} causal={int(causal)} "
                              f"sq={sq} sk={sk}: {exc}", flush=True)
                        return 3
                    ref, ref_lse = reference(q, k, v, causal, head_dim ** -0.5)
                    err = (out.float() - ref).abs().max().item()
                    seen = torch.isfinite(ref_lse)
                    lse_err = (lse - ref_lse)[seen].abs().max().item() if seen.any() else 0.0
                    want = expected_kernel(kforge_fmha, args.path, head_dim, causal, sk)
                    ok = (err <= TOL[dtype] and lse_err < 2e-3 and (want is None or ran == want)
                          and bool((out[~seen.transpose(1, 2)] == 0).all()))
                    bad += not ok
                    print(f"{'ok ' if ok else 'BAD'} {args.path:12s} {ran:25s} {str(dtype)[6:]:8s} "
                          f"d={head_dim:3d} causal={int(causal)} b={batch} sq={sq:5d} sk={sk:5d} "
                          f"h={h}/{hk} max|err|={err:.2e} lse_err={lse_err:.1e}", flush=True)
    print(f"{args.path}: {'PASS' if not bad else f'FAIL ({bad} bad cases)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
