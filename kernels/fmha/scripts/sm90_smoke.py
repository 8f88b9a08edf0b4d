"""Quick check of the head-dim-128 kernel that this process selects (KFORGE_FMHA_SM90=0/1):
max error against fp32 SDPA for a few shapes, then bf16 TFLOP/s against SDPA flash.
Run on the GPU host after installing kforge_fmha:  python kernels/fmha/scripts/sm90_smoke.py
"""
import os
import statistics

import kforge_fmha
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def ref(q, k, v, causal):
    h, hk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + (sk - sq)
    s = torch.einsum("bhqd,bhkd->bhqk", qt, kt) / 128 ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    return out.transpose(1, 2), lse


def time_ms(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(10)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def bench(tag, causal, seqlen):
    batch = 16384 // seqlen
    q, k, v = (torch.randn(batch, seqlen, 16, 128, dtype=torch.bfloat16, device="cuda")
               for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    flops = 4 * batch * 16 * seqlen * seqlen * 128 / (2 if causal else 1)
    t_ours = time_ms(lambda: kforge_fmha.fmha_fwd(q, k, v, causal=causal))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t_fa = time_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    print(f"[{tag}] bf16 h128 causal={int(causal)} L={seqlen}: ours {flops / t_ours / 1e9:.0f} "
          f"TFLOP/s, flash {flops / t_fa / 1e9:.0f}, x{t_fa / t_ours:.2f}")


def main():
    torch.manual_seed(0)
    tag = os.environ.get("KFORGE_FMHA_SM90", "default")
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            for b, sq, sk, h, hk in ((1, 1, 1, 2, 2), (2, 17, 17, 4, 2), (1, 127, 300, 2, 1),
                                     (1, 128, 128, 2, 2), (2, 129, 129, 2, 2),
                                     (1, 1000, 1000, 4, 4), (1, 300, 4097, 2, 2),
                                     (1, 4097, 4097, 2, 1)):
                q = torch.randn(b, sq, h, 128, dtype=dtype, device="cuda")
                k = torch.randn(b, sk, hk, 128, dtype=dtype, device="cuda")
                v = torch.randn(b, sk, hk, 128, dtype=dtype, device="cuda")
                o, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, return_lse=True)
                ro, rl = ref(q, k, v, causal)
                err = (o.float() - ro).abs().nan_to_num(99).max().item()
                fin = torch.isfinite(rl)
                lerr = (lse[fin] - rl[fin]).abs().max().item() if fin.any() else 0.0
                worst = max(worst, err)
                flag = "BAD" if not (err < 2e-2 and lerr < 2e-3) else "ok"
                print(f"[{tag}] {str(dtype)[6:]} causal={int(causal)} b{b} sq{sq} sk{sk} h{h}/{hk}: "
                      f"max|o-ref|={err:.2e} lse={lerr:.2e} {flag}")
    print(f"[{tag}] worst output error {worst:.2e}")
    for causal in (False, True):
        for seqlen in (2048, 8192):
            bench(tag, causal, seqlen)


if __name__ == "__main__":
    main()
