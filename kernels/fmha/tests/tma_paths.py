"""The sm_90a paths of kforge_fmha and the kernel each must run: one table for tests/test_gpu.py and
scripts/tma_smoke.py (no torch needed here)."""

from __future__ import annotations

ALL_PATHS = ["default", "wgmma", "tma-basic", "tma-overlap", "tma", "tma-lpt", "tma-pp-lpt",
             "tma-stages", "tma-m192", "tma-m192-lpt", "tma-persist", "tma-pp-stages", "tma-n176",
             "tma-pp-n176", "tma-dyn", "tma-pp-dyn", "tma-dyn-xt", "tma-dyn-n176", "tma-pp-dyn-n176", "tma-dyn-skew",
             "tma-dyn-n176-skew", "tma-pp-dyn-skew", "tma-dyn-fe", "tma-dyn-ts",
             "tma-dyn-fs"]
# The kernel each TMA path runs (kforge_fmha.last_kernel), by head dim (fmha_api.cpp's
# kTmaKernels): the three-consumer-warpgroup variants exist at hdim 64 only, the 176-key tiles at
# hdim 128 only.
TMA_KERNEL = {
    "tma-basic": {64: "sm90_tma_basic", 128: "sm90_tma_basic"},
    "tma-overlap": {64: "sm90_tma_overlap", 128: "sm90_tma_overlap"},
    "tma": {64: "sm90_tma", 128: "sm90_tma"},
    "tma-lpt": {64: "sm90_tma_overlap_lpt", 128: "sm90_tma_overlap_lpt"},
    "tma-pp-lpt": {64: "sm90_tma_lpt", 128: "sm90_tma_lpt"},
    "tma-stages": {64: "sm90_tma_overlap_stages", 128: "sm90_tma_overlap_stages"},
    "tma-m192": {64: "sm90_tma_overlap_m192", 128: "sm90_tma_overlap"},
    "tma-m192-lpt": {64: "sm90_tma_overlap_m192_lpt", 128: "sm90_tma_overlap_lpt"},
    "tma-persist": {64: "sm90_tma_overlap_persist", 128: "sm90_tma_overlap_persist"},
    "tma-pp-stages": {64: "sm90_tma_stages", 128: "sm90_tma_stages"},
    "tma-n176": {64: "sm90_tma_overlap", 128: "sm90_tma_overlap_n176"},
    "tma-pp-n176": {64: "sm90_tma", 128: "sm90_tma_n176"},
    "tma-dyn": {64: "sm90_tma_overlap_dyn", 128: "sm90_tma_overlap_dyn"},
    "tma-pp-dyn": {64: "sm90_tma_dyn", 128: "sm90_tma_dyn"},
    "tma-dyn-xt": {64: "sm90_tma_overlap_dyn_xt", 128: "sm90_tma_overlap_dyn_xt"},
    "tma-dyn-n176": {64: "sm90_tma_overlap_dyn", 128: "sm90_tma_overlap_dyn_n176"},
    "tma-pp-dyn-n176": {64: "sm90_tma_dyn", 128: "sm90_tma_dyn_n176"},
    "tma-dyn-skew": {64: "sm90_tma_overlap_dyn", 128: "sm90_tma_overlap_dyn"},
    "tma-dyn-n176-skew": {64: "sm90_tma_overlap_dyn", 128: "sm90_tma_overlap_dyn_n176"},
    "tma-pp-dyn-skew": {64: "sm90_tma_dyn", 128: "sm90_tma_dyn"},
    "tma-dyn-fe": {64: "sm90_tma_overlap_dyn_fe", 128: "sm90_tma_overlap_dyn_fe"},
    "tma-dyn-ts": {64: "sm90_tma_overlap_dyn_ts", 128: "sm90_tma_overlap_dyn_ts"},
    "tma-dyn-fs": {64: "sm90_tma_overlap_dyn_fs", 128: "sm90_tma_overlap_dyn_fs"},
}


def default_path(head_dim: int, causal: bool, seqlen_k: int) -> str:
    """The TMA path the default picks for a fixed-length call (fmha_api.cpp's default_tma_path,
    chosen from the interleaved tuning run in docs/benchmarks.md)."""
    if head_dim == 64:
        if not causal:
            return "tma-m192"
        return "tma-dyn-fs" if seqlen_k <= 2048 else "tma-m192-lpt"
    if causal:
        return "tma-dyn-fs" if seqlen_k <= 8192 else "tma-dyn-n176"
    return "tma-dyn-fs" if seqlen_k <= 4096 else "tma-dyn-n176"
