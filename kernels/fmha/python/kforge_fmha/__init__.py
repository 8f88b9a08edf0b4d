"""kforge_fmha: fused attention (FlashAttention-2 style) for fp16/bf16, head dims 64 and 128
((d_qk, d_v) = (192, 128) and (128, 192) too with gradients), causal or not, GQA/MQA and packed
variable-length batches.

``fmha_fwd`` / ``fmha_varlen_fwd`` run the forward; ``attention`` / ``varlen_attention`` are the
same attention with gradients (torch only: a torch.autograd.Function whose backward runs the
library's backward kernels).

The kernels live in libkforge_fmha.so, a plain C library called through ctypes; nothing here
links against torch. torch tensors and any DLPack producer (CuPy, JAX, ...) are accepted.
torch tensors run on torch's current CUDA stream; under ``torch.compile`` the call is the
custom op ``torch.ops.kforge_fmha.fwd`` (registered with a fake implementation), in eager mode
the op's body runs directly.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from . import _api, _lib
from ._lib import (
    FmhaArgumentError,
    FmhaCudaError,
    FmhaError,
    FmhaNoDeviceError,
    FmhaUnsupportedError,
    library_path,
)
from ._paths import (
    default_path,
    path_built,
    path_fallback_kernel,
    path_kernel,
    sm90_paths,
    tuning_paths_built,
)
from ._tensor import describe, is_torch_tensor

__version__ = "0.1.0"

__all__ = [
    "FmhaArgumentError",
    "FmhaCudaError",
    "FmhaError",
    "FmhaNoDeviceError",
    "FmhaUnsupportedError",
    "attention",
    "built_archs",
    "default_path",
    "device_check",
    "fmha_fwd",
    "fmha_varlen_fwd",
    "last_kernel",
    "library_path",
    "library_version",
    "path_built",
    "path_fallback_kernel",
    "path_kernel",
    "sm90_paths",
    "tuning_paths_built",
    "varlen_attention",
]


def library_version() -> str:
    """Version string of the loaded C library."""
    return _lib.library().kforge_fmha_version().decode()


def built_archs() -> list[str]:
    """CUDA archs the C library was compiled for, e.g. ['90a']."""
    return _lib.library().kforge_fmha_built_archs().decode().split()


def last_kernel() -> str:
    """Name of the kernel the last kforge_fmha call on this thread launched: "mma_sync",
    "sm90_wgmma" or one of the TMA kernels ("sm90_tma", "sm90_tma_overlap", "sm90_tma_lpt",
    "sm90_tma_overlap_m192", ...; "" before any call); for a backward, "bwd_sm90_wgmma" (the
    sm_90a main kernel) or "bwd_mma_sync" (the portable one; KFORGE_FMHA_BWD_PATH "portable",
    "sm90" or unset picks, and the deterministic mode always runs it). Autograd runs a CUDA
    backward on its own thread: read it there (e.g. in a gradient hook).

    On H100/H200 the environment variable KFORGE_FMHA_SM90_PATH (read at every call) picks the
    sm_90a path: unset or "default" (a TMA path per shape, default_path()), "wgmma", or one of
    sm90_paths(); calls a TMA path cannot take (varlen batches) run the wgmma kernel (hdim 128)
    or the mma.sync kernel (hdim 64). The wheel holds only the kernels the default reaches
    (path_built()); asking for another path raises FmhaUnsupportedError.
    """
    lib = _lib.library()
    if not hasattr(lib, "kforge_fmha_last_kernel"):
        raise FmhaError(f"kforge_fmha: the loaded library {library_path()} predates last_kernel(); "
                        "rebuild or reinstall kforge-fmha")
    return lib.kforge_fmha_last_kernel().decode()


def device_check() -> tuple[int, int]:
    """(major, minor) compute capability of the current GPU; raises FmhaNoDeviceError without one."""
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    _lib.check(_lib.library().kforge_fmha_device_check(ctypes.byref(major), ctypes.byref(minor)))
    return major.value, minor.value


def fmha_fwd(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
             return_lse: bool = False, out: Any = None, lse: Any = None,
             stream: int | None = None) -> Any:
    """Attention over a fixed-length batch.

    q: (batch, seqlen_q, num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_k, head_dim).
    Returns out (like q), or (out, lse) with lse (batch, num_heads, seqlen_q) float32 when
    return_lse. softmax_scale defaults to 1/sqrt(head_dim). Causal masks are aligned to the
    bottom-right corner (query i sees key j <= i + seqlen_k - seqlen_q).
    """
    _require("fmha_fwd", q=q, k=k, v=v)
    return _call(q, k, v, None, None, None, None, causal, softmax_scale, return_lse, out, lse,
                 stream)


def fmha_varlen_fwd(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                    max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                    softmax_scale: float | None = None, return_lse: bool = False,
                    out: Any = None, lse: Any = None, stream: int | None = None) -> Any:
    """Attention over a packed variable-length batch.

    q: (total_q, num_heads, head_dim); k, v: (total_k, num_heads_k, head_dim); cu_seqlens_q/k:
    int32 (batch + 1,) prefix sums on the GPU. max_seqlen_q must be >= every query length.
    lse has shape (num_heads, total_q).
    """
    _require("fmha_varlen_fwd", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, return_lse, out, lse, stream)


def attention(q: Any, k: Any, v: Any, causal: bool = False, softmax_scale: float | None = None, *,
              deterministic: bool | None = None) -> Any:
    """Attention over a fixed-length batch, differentiable: torch tensors only.

    q: (batch, seqlen_q, num_heads, d_qk); k: (batch, seqlen_k, num_heads_k, d_qk); v: (batch,
    seqlen_k, num_heads_k, d_v), with (d_qk, d_v) in (64, 64), (128, 128), (192, 128), (128,
    192); fp16 or bf16 on a CUDA device. Returns out (batch, seqlen_q, num_heads, d_v). GQA/MQA
    when num_heads_k divides num_heads (dk, dv summed over each group). Causal masks are aligned
    to the bottom-right corner (query i sees key j <= i + seqlen_k - seqlen_q). softmax_scale
    defaults to 1/sqrt(d_qk). deterministic: dq bit for bit reproducible (slower); None follows
    torch.are_deterministic_algorithms_enabled().

    The backward runs kforge_fmha's backward kernels on the saved q, k, v, out and log-sum-exp.
    Under torch.compile the call is the custom op torch.ops.kforge_fmha.attn_fwd, whose
    backward is torch.ops.kforge_fmha.attn_bwd (register_autograd), so fullgraph=True works.
    """
    _require("attention", q=q, k=k, v=v)
    return _autograd_module().run(q, k, v, None, None, None, None, causal, softmax_scale,
                                  deterministic)


def varlen_attention(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     softmax_scale: float | None = None, *,
                     deterministic: bool | None = None) -> Any:
    """attention() over a packed variable-length batch, differentiable: torch tensors only.

    q: (total_q, num_heads, d_qk); k: (total_k, num_heads_k, d_qk); v: (total_k, num_heads_k,
    d_v); cu_seqlens_q/k: int32 (batch + 1,) prefix sums on the GPU; max_seqlen_q/k at least
    every length. Empty sequences are allowed (their rows get out 0 and zero gradients).
    """
    _require("varlen_attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
             cu_seqlens_k=cu_seqlens_k)
    return _autograd_module().run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, causal, softmax_scale, deterministic)


_autograd_mod = None  # kforge_fmha._autograd once imported (it imports torch)


def _autograd_module():
    global _autograd_mod
    if _autograd_mod is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise FmhaError(
                "kforge_fmha: attention() and varlen_attention() need torch, which is not "
                "installed; install it (pip install 'kforge-fmha[torch]'), or call fmha_fwd / "
                "fmha_varlen_fwd, which run the forward on any DLPack producer") from None
        from . import _autograd

        _autograd_mod = _autograd
    return _autograd_mod


def _require(func: str, **tensors: Any) -> None:
    """A missing tensor is a TypeError that names it (not a KeyError from deep inside)."""
    for name, value in tensors.items():
        if value is None:
            raise TypeError(f"{func}() needs {name}: a CUDA tensor (torch, or any DLPack producer), not None")


def _call(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, return_lse, out, lse,
          stream):
    varlen = cu_q is not None or cu_k is not None
    tensors = [q, k, v] + ([cu_q, cu_k] if varlen else [])
    all_torch = all(is_torch_tensor(t) for t in tensors if t is not None)

    if all_torch and out is None and lse is None and stream is None:
        torch = sys.modules["torch"]
        if torch.compiler.is_compiling() or q.device.type == "meta":
            # Inside torch.compile (or for shape-only meta tensors): check shapes now, then
            # emit the custom op.
            qi, ki, vi = describe("q", q), describe("k", k), describe("v", v)
            ci = describe("cu_seqlens_q", cu_q) if varlen else None
            cki = describe("cu_seqlens_k", cu_k) if varlen else None
            p = _api.validate(qi, ki, vi, varlen=varlen, cu_q=ci, cu_k=cki, max_seqlen_q=max_q,
                              max_seqlen_k=max_k, softmax_scale=softmax_scale, causal=causal)
            from . import _torch

            _torch.ensure_registered()
            o, lse_ = torch.ops.kforge_fmha.fwd(q, k, v, cu_q, cu_k, p.seqlen_q, p.seqlen_k,
                                             p.softmax_scale, p.causal)
        else:
            # Eager: the op's own body, without the dispatcher's per-call cost.
            o, lse_ = _api.run_torch(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal)
        return (o, lse_) if return_lse else o

    names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")
    infos = [describe(n, t, stream) if t is not None else None for n, t in zip(names, tensors, strict=False)]
    qi, ki, vi = infos[:3]
    ci, cki = (infos[3], infos[4]) if varlen else (None, None)
    p = _api.validate(qi, ki, vi, varlen=varlen, cu_q=ci, cu_k=cki, max_seqlen_q=max_q,
                      max_seqlen_k=max_k, softmax_scale=softmax_scale, causal=causal)

    # Direct path: caller-provided outputs, a caller-chosen stream, or non-torch arrays.
    if out is None:
        if not all_torch:
            raise FmhaArgumentError(
                "kforge_fmha: pass out= (and lse= if you need it) when the inputs are not torch "
                "tensors; kforge_fmha does not allocate memory for DLPack producers")
        torch = sys.modules["torch"]
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is None and return_lse and all_torch:
        torch = sys.modules["torch"]
        lse = torch.empty(_api.Problem.lse_shape_for(varlen, p.batch, p.num_heads, p.seqlen_q,
                                                     q.shape[0] if varlen else None),
                          dtype=torch.float32, device=q.device)
    oi = describe("out", out, stream)
    li = describe("lse", lse, stream) if lse is not None else None
    _api.check_outputs(p, qi, oi, li)
    if stream is None:
        stream = _api.torch_stream(p.device_index) if all_torch else 0
    _api.launch(p, qi, ki, vi, oi, li, ci, cki, stream)
    return (out, lse) if return_lse else out


if "torch" in sys.modules:  # torch already imported by the caller: register the op now
    from . import _torch as _torch_mod

    _torch_mod.ensure_registered()
    _autograd_module()  # and the autograd ops (kforge_fmha::attn_fwd / attn_bwd)
