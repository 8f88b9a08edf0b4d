"""CPU checks of the numerics behind tests/test_bwd_gpu.py's tolerance (issue 31), no GPU.

scripts/softmax_rounding_model.py models the rounding of the forward's online softmax (the stale
reference max, FlashAttention-2's running max, and O normalised by the rounded P's sum) and of the
portable backward; its --check asserts that the stale max costs O accuracy that the rounded sum
restores, and that against a reference computed in the input dtype every rule passes FlashAttention's
tolerance with a wide margin. The other test pins the torch behaviour the GPU tests' reference relies
on: SDPA's math backend computes fp16/bf16 inputs in fp32 unless fp16/bf16 reductions are allowed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_softmax_rounding_model_claims_hold() -> None:
    res = subprocess.run([sys.executable, str(SCRIPTS / "softmax_rounding_model.py"), "--check",
                          "--seeds", "6"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_math_sdpa_rounds_intermediates_only_with_reductions_allowed(dtype) -> None:
    """Without the switch the fp16/bf16 math backend is the fp32 result rounded once (so it
    measures no intermediate rounding); with it the result differs from that."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g).to(dtype) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3).to(dtype)
        before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
        try:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
            upcast = F.scaled_dot_product_attention(q, k, v, scale=0.3)
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
            low = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        finally:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(before)
    assert torch.equal(upcast, exact)
    assert not torch.equal(low, exact)
