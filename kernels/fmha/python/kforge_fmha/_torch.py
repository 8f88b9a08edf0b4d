"""The torch.library custom op ``kforge_fmha::fwd``, so torch.compile graphs can call the kernel.

Registered once, the first time torch tensors reach kforge_fmha (or at import when torch is
already imported). Written without ``from __future__ import annotations``: torch infers the
op schema from these annotations.
"""

import threading
from typing import Optional, Tuple

from ._tensor import torch_module

_lock = threading.Lock()
_registered = False

OP_NAME = "kforge_fmha::fwd"


def ensure_registered() -> None:
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        torch = torch_module()
        if torch is None:
            import torch  # noqa: F401  (only reached when a caller passed torch tensors)
        _register(torch)
        _registered = True


def _register(torch) -> None:
    from torch import Tensor

    from . import _api

    @torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cuda")
    def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
            cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
            softmax_scale: float, causal: bool) -> Tuple[Tensor, Tensor]:
        return _api.run_torch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              softmax_scale, causal)

    @fwd.register_fake
    def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal):
        if cu_seqlens_q is not None:
            lse_shape = (q.shape[1], q.shape[0])
        else:
            lse_shape = (q.shape[0], q.shape[2], q.shape[1])
        return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)
