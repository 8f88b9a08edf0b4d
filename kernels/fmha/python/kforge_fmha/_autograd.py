"""Attention with gradients for torch: ``kforge_fmha.attention`` and ``kforge_fmha.varlen_attention``.

The forward runs kforge_fmha_fwd_v2 / kforge_fmha_varlen_fwd_v2 (q and k of head dim d_qk, v and
the output of d_v) and keeps O and the log-sum-exp; the backward runs kforge_fmha_bwd /
kforge_fmha_varlen_bwd through ``_api.bwd_torch`` on the saved q, k, v, O and LSE.

Two routes to the same two bodies (``forward_torch``, ``backward_torch``):

- eager: ``AttentionFunction``, a ``torch.autograd.Function`` that calls the bodies directly
  (no dispatcher in between, as ``fmha_fwd`` does for its op);
- ``torch.compile`` (and meta tensors): the custom ops ``kforge_fmha::attn_fwd`` and
  ``kforge_fmha::attn_bwd`` (``torch.library.custom_op`` with fake implementations), the
  backward tied to the forward with ``register_autograd``, so a ``fullgraph=True`` compile of a
  training step keeps both as opaque nodes of one graph.

This module imports torch: the package imports it only when torch is already imported or when
``attention`` / ``varlen_attention`` is first called, so ``import kforge_fmha`` stays torch-free.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import _api, _lib
from ._lib import FmhaArgumentError, FmhaUnsupportedError
from ._tensor import TensorInfo, describe

FWD_OP = "kforge_fmha::attn_fwd"
BWD_OP = "kforge_fmha::attn_bwd"


@dataclass(frozen=True)
class Shape:
    """One attention call's sizes after validation."""

    varlen: bool
    batch: int
    seqlen_q: int  # max_seqlen_q when varlen
    seqlen_k: int  # max_seqlen_k when varlen
    num_heads: int
    num_heads_k: int
    d_qk: int
    d_v: int
    dtype: str
    softmax_scale: float
    causal: bool

    def out_shape(self, q_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(q_shape[:-1]) + (self.d_v,)

    def lse_shape(self, q_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.varlen:
            return (self.num_heads, q_shape[0])
        return (self.batch, self.num_heads, self.seqlen_q)


def _err(msg: str) -> FmhaArgumentError:
    return FmhaArgumentError(f"kforge_fmha: {msg}")


def validate(q: TensorInfo, k: TensorInfo, v: TensorInfo, cu_q: TensorInfo | None,
             cu_k: TensorInfo | None, max_seqlen_q: int | None, max_seqlen_k: int | None,
             softmax_scale: float | None, causal: bool) -> Shape:
    """The checks of attention() / varlen_attention(): those of fmha_fwd, with v of its own head
    dim ((d_qk, d_v) one of _api.HEAD_DIM_PAIRS)."""
    varlen = cu_q is not None or cu_k is not None
    for t in (q, k, v):
        _api._check_device(t, q)
    if q.dtype not in _api._DTYPE_CODES:
        raise _err(f"q has dtype {q.dtype}; kforge_fmha's kernels take float16 and bfloat16 (cast "
                   "with .half() / .bfloat16(), or run under torch.autocast)")
    for t in (k, v):
        if t.dtype != q.dtype:
            raise _err(f"{t.name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must share one "
                       "dtype")
    ndim = 3 if varlen else 4
    layout = ("(total_tokens, num_heads, head_dim)" if varlen
              else "(batch, seqlen, num_heads, head_dim)")
    for t in (q, k, v):
        if len(t.shape) != ndim:
            raise _err(f"{t.name} has {len(t.shape)} dimensions {t.shape}; expected {ndim}: {layout}")
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if (d_qk, d_v) not in _api.HEAD_DIM_PAIRS:
        raise FmhaUnsupportedError(
            f"kforge_fmha: (head_dim of q/k, head_dim of v) = ({d_qk}, {d_v}) has no kernel; the "
            f"supported pairs are {', '.join(map(str, _api.HEAD_DIM_PAIRS))}")
    if k.shape[-1] != d_qk:
        raise _err(f"k's head_dim is {k.shape[-1]} but q's is {d_qk}; q and k must share it")
    if k.shape[:-1] != v.shape[:-1]:
        raise _err(f"k has shape {k.shape} and v {v.shape}; they must match in every dimension but "
                   "the last (head_dim)")
    num_heads, num_heads_k = q.shape[-2], k.shape[-2]
    if num_heads_k < 1 or num_heads % num_heads_k != 0:
        raise _err(f"q has {num_heads} heads and k/v have {num_heads_k}; for GQA/MQA the number of "
                   "kv heads must divide the number of query heads")
    for t in (q, k, v):
        _api._check_layout(t)
    batch, seqlen_q, seqlen_k = _api._batch_and_lengths(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, varlen)
    scale = _api._softmax_scale(softmax_scale, d_qk)
    return Shape(varlen=varlen, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                 num_heads=num_heads, num_heads_k=num_heads_k, d_qk=d_qk, d_v=d_v, dtype=q.dtype,
                 softmax_scale=scale, causal=bool(causal))


def _describe_all(q, k, v, cu_q, cu_k):
    infos = [describe("q", q), describe("k", k), describe("v", v)]
    infos.append(describe("cu_seqlens_q", cu_q) if cu_q is not None else None)
    infos.append(describe("cu_seqlens_k", cu_k) if cu_k is not None else None)
    return infos


def _strides(t: TensorInfo, n: int) -> ctypes.Array:
    """The first n strides for the C API; a size-1 dimension may carry any stride: 0."""
    return _lib.strides(*[s if size > 1 else 0 for size, s in zip(t.shape, t.strides, strict=True)][:n])


# --- the two bodies ---------------------------------------------------------------------------


def forward_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal) -> tuple[Any, Any]:
    """(out, lse): out like q with v's head dim, lse float32 (batch, heads, seqlen_q), varlen
    (heads, total_q); launched on torch's current stream. Rows that see no key get out 0 and
    lse -inf."""
    qi, ki, vi, ci, cki = _describe_all(q, k, v, cu_seqlens_q, cu_seqlens_k)
    s = validate(qi, ki, vi, ci, cki, max_seqlen_q, max_seqlen_k, softmax_scale, causal)
    out = torch.empty(s.out_shape(q.shape), dtype=q.dtype, device=q.device)
    lse = torch.empty(s.lse_shape(q.shape), dtype=torch.float32, device=q.device)
    if out.numel() == 0:  # no query rows: nothing to compute (the C API takes no NULL pointers)
        return out, lse
    if k.numel() == 0:  # no keys anywhere: every row sees none
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    lib = _lib.library()
    if not hasattr(lib, "kforge_fmha_fwd_v2"):
        raise FmhaUnsupportedError(
            f"kforge_fmha: the loaded library {_lib.library_path()} predates kforge_fmha_fwd_v2 and "
            "the backward; rebuild or reinstall kforge-fmha")
    oi, li = describe("out", out), describe("lse", lse)
    dtype = _api._DTYPE_CODES[s.dtype]
    stream = _api.torch_stream(qi.device_index) or None
    if s.varlen:
        q_s, k_s, v_s, o_s = (_strides(t, 2) for t in (qi, ki, vi, oi))
        status = lib.kforge_fmha_varlen_fwd_v2(
            dtype, s.d_qk, s.d_v, qi.ptr, q_s, ki.ptr, k_s, vi.ptr, v_s, oi.ptr, o_s, li.ptr,
            li.strides[0], ci.ptr, cki.ptr, s.batch, s.seqlen_q, s.seqlen_k, s.num_heads,
            s.num_heads_k, s.softmax_scale, int(s.causal), stream)
    else:
        q_s, k_s, v_s, o_s = (_strides(t, 3) for t in (qi, ki, vi, oi))
        status = lib.kforge_fmha_fwd_v2(
            dtype, s.d_qk, s.d_v, qi.ptr, q_s, ki.ptr, k_s, vi.ptr, v_s, oi.ptr, o_s, li.ptr,
            _strides(li, 2), s.batch, s.seqlen_q, s.seqlen_k, s.num_heads, s.num_heads_k,
            s.softmax_scale, int(s.causal), stream)
    _lib.check(status)
    return out, lse


def _kernel_ready(t) -> bool:
    """Whether the C API takes t as it is: head_dim contiguous, the other strides non-negative
    multiples of 8 elements, a 16-byte aligned pointer."""
    shape, strides = t.shape, t.stride()
    if shape[-1] > 1 and strides[-1] != 1:
        return False
    if any(n > 1 and (s < 0 or s % 8) for n, s in zip(shape[:-1], strides[:-1], strict=True)):
        return False
    return t.data_ptr() % 16 == 0


def backward_torch(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, softmax_scale, causal, deterministic) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) for the gradient dout of out = attention(q, k, v): the forward's own out and
    lse must be passed. dout may have any layout (autograd hands out expanded or strided
    gradients); it is copied when the kernels cannot read it as it is."""
    if q.numel() == 0 or k.numel() == 0:
        # Nothing was attended: zero gradients, contiguous like the fake implementation's.
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if dout.dtype != out.dtype:
        dout = dout.to(out.dtype)
    if not _kernel_ready(dout):
        dout = dout.contiguous()
    return _api.bwd_torch(q, k, v, out, dout, lse, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q if cu_seqlens_q is not None else None,
                          max_seqlen_k=max_seqlen_k if cu_seqlens_q is not None else None,
                          softmax_scale=softmax_scale, causal=causal,
                          deterministic=deterministic)


# --- eager: an autograd.Function over the bodies ----------------------------------------------


class AttentionFunction(torch.autograd.Function):
    """out = attention(q, k, v); the backward is kforge_fmha's (dq, dk, dv), not differentiable
    again (once_differentiable)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                softmax_scale, causal, deterministic):
        out, lse = forward_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 softmax_scale, causal)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = backward_torch(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None


# --- torch.compile: custom ops, the backward tied by register_autograd -------------------------

_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
               "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
               "bool deterministic) -> (Tensor, Tensor)")
_BWD_SCHEMA = ("(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
               "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
               "float softmax_scale, bool causal, bool deterministic) -> (Tensor, Tensor, Tensor)")


def _attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
              causal, deterministic):
    return forward_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal)


def _attn_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, deterministic):
    if cu_seqlens_q is not None:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def _attn_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              softmax_scale, causal, deterministic):
    return backward_torch(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k, softmax_scale, causal, deterministic)


def _attn_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, softmax_scale, causal, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, causal, deterministic)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.kforge_fmha.attn_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


attn_fwd = torch.library.custom_op(FWD_OP, _attn_fwd, mutates_args=(), device_types="cuda",
                                   schema=_FWD_SCHEMA)
attn_fwd.register_fake(_attn_fwd_fake)
attn_bwd = torch.library.custom_op(BWD_OP, _attn_bwd, mutates_args=(), device_types="cuda",
                                   schema=_BWD_SCHEMA)
attn_bwd.register_fake(_attn_bwd_fake)
attn_fwd.register_autograd(_op_backward, setup_context=_setup_context)


# --- the public functions ------------------------------------------------------------------------


def run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
        deterministic):
    """attention() / varlen_attention() once the arguments are present: the custom op while
    torch.compile traces (or for meta tensors, shapes only), the autograd.Function otherwise."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise _err(f"{name} is a {type(t).__name__}; attention() and varlen_attention() take "
                       "torch tensors (for other DLPack producers, fmha_fwd runs the forward alone)")
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if q.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        # As SDPA under autocast: float32 inputs run in the autocast dtype (fp16 or bf16).
        low = torch.get_autocast_dtype("cuda")
        if low in (torch.float16, torch.bfloat16):
            q, k, v = (t.to(low) if t.dtype == torch.float32 else t for t in (q, k, v))
    if torch.compiler.is_compiling() or q.device.type == "meta":
        # Check the shapes now (the fake implementation does not), then emit the op.
        s = validate(*_describe_all(q, k, v, cu_seqlens_q, cu_seqlens_k), max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal)
        out, _ = torch.ops.kforge_fmha.attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, s.seqlen_q,
                                                s.seqlen_k, s.softmax_scale, s.causal,
                                                bool(deterministic))
        return out
    # The body validates (once); the default scale is fixed here so the backward gets the same.
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(max(q.shape[-1:] or (1,)))
    return AttentionFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   scale, bool(causal), bool(deterministic))
