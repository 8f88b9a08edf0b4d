"""Argument checks and the calls into libkforge_fmha.so."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from . import _lib
from ._lib import FmhaArgumentError, FmhaUnsupportedError
from ._tensor import TensorInfo, describe, torch_module

_DTYPE_CODES = {"float16": 0, "bfloat16": 1}
HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class Problem:
    """The sizes of one attention call, after validation."""

    varlen: bool
    batch: int
    seqlen_q: int  # max_seqlen_q when varlen
    seqlen_k: int  # max_seqlen_k when varlen
    num_heads: int
    num_heads_k: int
    head_dim: int
    dtype: str
    device_index: int
    softmax_scale: float
    causal: bool

    @property
    def lse_shape(self) -> tuple[int, ...]:
        return self.lse_shape_for(self.varlen, self.batch, self.num_heads, self.seqlen_q, None)

    @staticmethod
    def lse_shape_for(varlen: bool, batch: int, heads: int, seqlen_q: int,
                      total_q: int | None) -> tuple[int, ...]:
        return (heads, total_q if total_q is not None else seqlen_q) if varlen else (batch, heads, seqlen_q)


def _err(msg: str) -> FmhaArgumentError:
    return FmhaArgumentError(f"kforge_fmha: {msg}")


def _check_device(t: TensorInfo, ref: TensorInfo | None) -> None:
    if t.device_type not in ("cuda", "meta"):
        raise _err(f"{t.name} is on {t.device}; kforge_fmha runs on CUDA tensors "
                   f"(move it with .cuda() or .to('cuda'))")
    if ref is not None and t.device_type == "cuda" and ref.device_type == "cuda" \
            and t.device_index != ref.device_index:
        raise _err(f"{t.name} is on {t.device} but {ref.name} is on {ref.device}; "
                   "all tensors must be on the same GPU")


def _check_layout(t: TensorInfo) -> None:
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise _err(f"{t.name}'s last dimension (head_dim) is not contiguous (stride "
                   f"{t.strides[-1]}); call .contiguous() first")
    for dim, (size, stride) in enumerate(zip(t.shape[:-1], t.strides[:-1])):  # noqa: B905 (3.9)
        if size > 1 and (stride < 0 or stride % 8 != 0):
            raise _err(f"{t.name} has stride {stride} in dimension {dim}; every stride but the "
                       "last must be a non-negative multiple of 8 elements (16-byte aligned rows); "
                       "call .contiguous() first")
    if t.ptr % 16 != 0:
        raise _err(f"{t.name}'s data pointer is not 16-byte aligned; it is a view at an odd "
                   "offset; call .contiguous() or .clone() first")


def validate(q: TensorInfo, k: TensorInfo, v: TensorInfo, *, varlen: bool,
             cu_q: TensorInfo | None = None, cu_k: TensorInfo | None = None,
             max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
             softmax_scale: float | None = None, causal: bool = False) -> Problem:
    for t in (q, k, v):
        _check_device(t, q)
    if q.dtype not in _DTYPE_CODES:
        raise _err(f"q has dtype {q.dtype}; kforge_fmha supports float16 and bfloat16")
    for t in (k, v):
        if t.dtype != q.dtype:
            raise _err(f"{t.name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must share "
                       "one dtype")
    ndim = 3 if varlen else 4
    layout = ("(total_tokens, num_heads, head_dim)" if varlen
              else "(batch, seqlen, num_heads, head_dim)")
    for t in (q, k, v):
        if len(t.shape) != ndim:
            raise _err(f"{t.name} has {len(t.shape)} dimensions {t.shape}; expected {ndim}: "
                       f"{layout}")
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        raise FmhaUnsupportedError(f"kforge_fmha: head_dim {head_dim} is not supported; "
                                   f"supported: {', '.join(map(str, HEAD_DIMS))}")
    if k.shape != v.shape:
        raise _err(f"k has shape {k.shape} but v has {v.shape}; they must match")
    if k.shape[-1] != head_dim:
        raise _err(f"k/v head_dim is {k.shape[-1]} but q's is {head_dim}")
    num_heads, num_heads_k = q.shape[-2], k.shape[-2]
    if num_heads_k < 1 or num_heads % num_heads_k != 0:
        raise _err(f"q has {num_heads} heads and k/v have {num_heads_k}; for GQA/MQA the number "
                   "of kv heads must divide the number of query heads")
    for t in (q, k, v):
        _check_layout(t)

    batch, seqlen_q, seqlen_k = _batch_and_lengths(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, varlen)
    scale = _softmax_scale(softmax_scale, head_dim)
    return Problem(varlen=varlen, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                   num_heads=num_heads, num_heads_k=num_heads_k, head_dim=head_dim,
                   dtype=q.dtype, device_index=q.device_index, softmax_scale=scale,
                   causal=bool(causal))


def check_outputs(p: Problem, q: TensorInfo, out: TensorInfo, lse: TensorInfo | None) -> None:
    _check_device(out, q)
    if out.shape != q.shape or out.dtype != q.dtype:
        raise _err(f"out has shape {out.shape} and dtype {out.dtype}; it must match q "
                   f"({q.shape}, {q.dtype})")
    _check_layout(out)
    if lse is not None:
        _check_device(lse, q)
        total_q = q.shape[0] if p.varlen else None
        want = Problem.lse_shape_for(p.varlen, p.batch, p.num_heads, p.seqlen_q, total_q)
        if lse.shape != want or lse.dtype != "float32":
            raise _err(f"lse has shape {lse.shape} and dtype {lse.dtype}; expected {want} float32")
        if lse.shape[-1] > 1 and lse.strides[-1] != 1:
            raise _err("lse's last dimension must be contiguous")


def launch(p: Problem, q: TensorInfo, k: TensorInfo, v: TensorInfo, out: TensorInfo,
           lse: TensorInfo | None, cu_q: TensorInfo | None, cu_k: TensorInfo | None,
           stream: int) -> None:
    """Call the C library. All tensors must already be validated."""
    lib = _lib.library()
    dtype = _DTYPE_CODES[p.dtype]

    def st(t: TensorInfo) -> list[int]:  # size-1 dims may carry any stride
        return [s if n > 1 else 0 for n, s in zip(t.shape, t.strides)]  # noqa: B905 (3.9)

    lse_ptr = lse.ptr if lse is not None else None
    if p.varlen:
        q_s, k_s, v_s, o_s = (_lib.strides(*st(t)[:2]) for t in (q, k, v, out))
        status = lib.kforge_fmha_varlen_fwd(
            dtype, p.head_dim, q.ptr, q_s, k.ptr, k_s, v.ptr, v_s, out.ptr, o_s,
            lse_ptr, st(lse)[0] if lse is not None else 0,
            cu_q.ptr, cu_k.ptr, p.batch, p.seqlen_q, p.seqlen_k, p.num_heads, p.num_heads_k,
            p.softmax_scale, int(p.causal), stream or None)
    else:
        q_s, k_s, v_s, o_s = (_lib.strides(st(t)[0], st(t)[1], st(t)[2]) for t in (q, k, v, out))
        lse_s = _lib.strides(*st(lse)[:2]) if lse is not None else None
        status = lib.kforge_fmha_fwd(
            dtype, p.head_dim, q.ptr, q_s, k.ptr, k_s, v.ptr, v_s, out.ptr, o_s, lse_ptr, lse_s,
            p.batch, p.seqlen_q, p.seqlen_k, p.num_heads, p.num_heads_k, p.softmax_scale,
            int(p.causal), stream or None)
    _lib.check(status)


def torch_stream(device_index: int) -> int:
    torch = torch_module()
    return int(torch.cuda.current_stream(device_index).cuda_stream)


def run_torch(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_seqlen_q: int | None,
              max_seqlen_k: int | None, softmax_scale: float | None,
              causal: bool) -> tuple[Any, Any]:
    """Eager body of the custom op: allocate outputs with torch and launch on its stream."""
    torch = torch_module()
    varlen = cu_q is not None
    qi, ki, vi = describe("q", q), describe("k", k), describe("v", v)
    ci = describe("cu_seqlens_q", cu_q) if varlen else None
    cki = describe("cu_seqlens_k", cu_k) if varlen else None
    p = validate(qi, ki, vi, varlen=varlen, cu_q=ci, cu_k=cki, max_seqlen_q=max_seqlen_q,
                 max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse_shape = Problem.lse_shape_for(varlen, p.batch, p.num_heads, p.seqlen_q,
                                      q.shape[0] if varlen else None)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    launch(p, qi, ki, vi, describe("out", out), describe("lse", lse), ci, cki,
           torch_stream(p.device_index))
    return out, lse


# --- backward -----------------------------------------------------------------------------------

#: (head_dim_qk, head_dim_v) pairs of the backward and of the _v2 forwards.
HEAD_DIM_PAIRS = ((64, 64), (128, 128), (192, 128), (128, 192))


def bwd_torch(q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, *,
              cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
              softmax_scale: float | None = None, causal: bool = False,
              deterministic: bool = False) -> tuple[Any, Any, Any]:
    """The attention backward for torch tensors: (dq, dk, dv), launched on torch's current stream.

    q (batch, seqlen_q, heads, d_qk), k (batch, seqlen_k, heads_k, d_qk), v (.., d_v); out and
    dout (the forward's output and its gradient) like q with d_v; lse the forward's (batch,
    heads, seqlen_q) float32. Varlen: 3-D tensors (total, heads, d), lse (heads, total_q),
    cu_seqlens_q/k int32 (batch + 1,) and max_seqlen_q/k (>= every length). causal and
    softmax_scale (default 1/sqrt(d_qk)) must be the forward's. dk and dv of a GQA kv head are
    summed over its query heads. deterministic: dq reproducible bit for bit (slower).
    The workspace is a torch allocation (the caching allocator, stream-ordered).
    """
    torch = torch_module()
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    infos = {n: describe(n, t) for n, t in
             (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse))}
    qi, ki, vi, oi, gi, li = infos.values()
    for t in infos.values():
        _check_device(t, qi)
    if qi.dtype not in _DTYPE_CODES:
        raise _err(f"q has dtype {qi.dtype}; kforge_fmha supports float16 and bfloat16")
    for t in (ki, vi, oi, gi):
        if t.dtype != qi.dtype:
            raise _err(f"{t.name} has dtype {t.dtype} but q has {qi.dtype}; they must share one")
    ndim = 3 if varlen else 4
    for t in (qi, ki, vi, oi, gi):
        if len(t.shape) != ndim:
            raise _err(f"{t.name} has {len(t.shape)} dimensions {t.shape}; expected {ndim}")
    d_qk, d_v = qi.shape[-1], vi.shape[-1]
    if (d_qk, d_v) not in HEAD_DIM_PAIRS:
        raise FmhaUnsupportedError(f"kforge_fmha: (head_dim_qk, head_dim_v) = ({d_qk}, {d_v}) is not "
                                   f"supported; supported: {HEAD_DIM_PAIRS}")
    if ki.shape[-1] != d_qk or ki.shape[:-1] != vi.shape[:-1]:
        raise _err(f"k {ki.shape} and v {vi.shape} must match except in the last dimension, and "
                   f"k's head_dim must be q's ({d_qk})")
    want_o = qi.shape[:-1] + (d_v,)
    for t in (oi, gi):
        if t.shape != want_o:
            raise _err(f"{t.name} has shape {t.shape}; expected {want_o} (q's with v's head_dim)")
    heads, heads_k = qi.shape[-2], ki.shape[-2]
    if heads_k < 1 or heads % heads_k != 0:
        raise _err(f"q has {heads} heads and k/v have {heads_k}; the kv heads must divide them")
    for t in (qi, ki, vi, oi, gi):
        _check_layout(t)
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None or max_seqlen_q is None \
                or max_seqlen_k is None:
            raise _err("a varlen backward needs cu_seqlens_q, cu_seqlens_k, max_seqlen_q and "
                       "max_seqlen_k")
        ci, cki = describe("cu_seqlens_q", cu_seqlens_q), describe("cu_seqlens_k", cu_seqlens_k)
        for t in (ci, cki):
            _check_device(t, qi)
            if t.dtype != "int32" or len(t.shape) != 1 or t.shape[0] < 2 \
                    or (t.shape[0] > 1 and t.strides[0] != 1):
                raise _err(f"{t.name} must be a contiguous int32 (batch + 1,) tensor")
        if ci.shape != cki.shape:
            raise _err("cu_seqlens_q and cu_seqlens_k must both have batch + 1 entries")
        batch, seqlen_q, seqlen_k = ci.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k)
        want_lse = (heads, qi.shape[0])
    else:
        batch, seqlen_q, seqlen_k = qi.shape[0], qi.shape[1], ki.shape[1]
        if ki.shape[0] != batch:
            raise _err(f"q has batch {batch} but k/v have {ki.shape[0]}")
        want_lse = (batch, heads, seqlen_q)
    if li.dtype != "float32" or li.shape != want_lse or (li.shape[-1] > 1 and li.strides[-1] != 1):
        raise _err(f"lse has shape {li.shape} and dtype {li.dtype}; expected {want_lse} float32 "
                   "with a contiguous last dimension (the forward's lse)")
    scale = 1.0 / math.sqrt(d_qk) if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise _err(f"softmax_scale is {scale}; it must be finite and > 0")

    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    lib = _lib.library()
    if not hasattr(lib, "kforge_fmha_bwd"):
        raise FmhaUnsupportedError(f"kforge_fmha: the loaded library {_lib.library_path()} has no "
                                   "backward; rebuild or reinstall kforge-fmha")
    dtype = _DTYPE_CODES[qi.dtype]
    size = ctypes.c_size_t(0)
    if varlen:
        _lib.check(lib.kforge_fmha_varlen_bwd_workspace_size(
            dtype, d_qk, d_v, batch, qi.shape[0], seqlen_q, seqlen_k, heads, heads_k, int(causal),
            int(deterministic), ctypes.byref(size)))
    else:
        _lib.check(lib.kforge_fmha_bwd_workspace_size(
            dtype, d_qk, d_v, batch, seqlen_q, seqlen_k, heads, heads_k, int(causal),
            int(deterministic), ctypes.byref(size)))
    ws = torch.empty(max(int(size.value), 1), dtype=torch.uint8, device=q.device)
    stream = torch_stream(qi.device_index)
    outs = [describe(n, t) for n, t in (("dq", dq), ("dk", dk), ("dv", dv))]

    def st(t: TensorInfo, n: int) -> ctypes.Array:  # size-1 dims may carry any stride
        return _lib.strides(*[s if size_ > 1 else 0 for size_, s in zip(t.shape, t.strides, strict=True)][:n])

    n = 2 if varlen else 3
    tensors = [(t.ptr, st(t, n)) for t in (qi, ki, vi, oi, gi)]
    grads = [(t.ptr, st(t, n)) for t in outs]
    flat = [x for pair in tensors for x in pair]
    flat_grads = [x for pair in grads for x in pair]
    if varlen:
        lse_head = li.strides[0] if li.shape[0] > 1 else 0
        status = lib.kforge_fmha_varlen_bwd(
            dtype, d_qk, d_v, *flat, li.ptr, lse_head, *flat_grads, ci.ptr, cki.ptr, batch,
            qi.shape[0], seqlen_q, seqlen_k, heads, heads_k, scale, int(causal), int(deterministic),
            ws.data_ptr(), ws.numel(), stream or None)
    else:
        lse_s = _lib.strides(*[s if size_ > 1 else 0 for size_, s in zip(li.shape, li.strides, strict=True)][:2])
        status = lib.kforge_fmha_bwd(
            dtype, d_qk, d_v, *flat, li.ptr, lse_s, *flat_grads, batch, seqlen_q, seqlen_k, heads,
            heads_k, scale, int(causal), int(deterministic), ws.data_ptr(), ws.numel(),
            stream or None)
    _lib.check(status)
    return dq, dk, dv


def _batch_and_lengths(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, varlen: bool) -> tuple:
    """(batch, seqlen_q, seqlen_k) of a call; a varlen call's cu_seqlens arrays and maxima are checked first.
    Shared by the forward here and the autograd functions (_autograd.py)."""
    if not varlen:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        if k.shape[0] != batch:
            raise _err(f"q has batch {batch} but k/v have {k.shape[0]}")
        return batch, seqlen_q, seqlen_k
    if cu_q is None or cu_k is None:
        raise _err("cu_seqlens_q and cu_seqlens_k are both required for a varlen call")
    for t in (cu_q, cu_k):
        _check_device(t, q)
        if t.dtype != "int32":
            raise _err(f"{t.name} has dtype {t.dtype}; it must be int32 (prefix sums of the "
                       "sequence lengths, starting at 0)")
        if len(t.shape) != 1 or t.shape[0] < 2:
            raise _err(f"{t.name} has shape {t.shape}; expected (batch + 1,) with batch >= 1")
        if t.strides[0] != 1:
            raise _err(f"{t.name} must be contiguous")
    if cu_q.shape != cu_k.shape:
        raise _err(f"cu_seqlens_q has {cu_q.shape[0]} entries and cu_seqlens_k has "
                   f"{cu_k.shape[0]}; both must be batch + 1")
    if max_seqlen_q is None or max_seqlen_k is None:
        raise _err("max_seqlen_q and max_seqlen_k are required for a varlen call")
    if int(max_seqlen_q) < 0 or int(max_seqlen_k) < 0:
        raise _err("max_seqlen_q and max_seqlen_k must be >= 0")
    return cu_q.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k)


def _softmax_scale(softmax_scale, head_dim: int) -> float:
    """The scale a call uses: 1/sqrt(head_dim of q and k) unless given; finite and > 0."""
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise _err(f"softmax_scale is {scale}; it must be finite and > 0")
    return scale
