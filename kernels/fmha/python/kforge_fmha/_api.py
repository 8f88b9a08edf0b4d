"""Argument checks and the calls into libkforge_fmha.so."""

from __future__ import annotations

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
    for dim, (size, stride) in enumerate(zip(t.shape[:-1], t.strides[:-1])):
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

    if varlen:
        if cu_q is None or cu_k is None:
            raise _err("cu_seqlens_q and cu_seqlens_k are both required for a varlen call")
        for t in (cu_q, cu_k):
            _check_device(t, q)
            if t.dtype != "int32":
                raise _err(f"{t.name} has dtype {t.dtype}; it must be int32 (prefix sums of the "
                           "sequence lengths, starting at 0)")
            if len(t.shape) != 1 or t.shape[0] < 2:
                raise _err(f"{t.name} has shape {t.shape}; expected (batch + 1,) with batch >= 1")
            if t.shape[0] > 1 and t.strides[0] != 1:
                raise _err(f"{t.name} must be contiguous")
        if cu_q.shape != cu_k.shape:
            raise _err(f"cu_seqlens_q has {cu_q.shape[0]} entries and cu_seqlens_k has "
                       f"{cu_k.shape[0]}; both must be batch + 1")
        if max_seqlen_q is None or max_seqlen_k is None:
            raise _err("max_seqlen_q and max_seqlen_k are required for a varlen call")
        if int(max_seqlen_q) < 0 or int(max_seqlen_k) < 0:
            raise _err("max_seqlen_q and max_seqlen_k must be >= 0")
        batch, seqlen_q, seqlen_k = cu_q.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k)
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        if k.shape[0] != batch:
            raise _err(f"q has batch {batch} but k/v have {k.shape[0]}")

    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise _err(f"softmax_scale is {scale}; it must be finite and > 0")
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
        return [s if n > 1 else 0 for n, s in zip(t.shape, t.strides)]

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
