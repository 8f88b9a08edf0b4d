"""A CPU model of the sm_90a backward main kernel (csrc/fmha_bwd_sm90.cuh), checked against
autograd.

It replays the kernel's index arithmetic thread by thread: the cp.async loader's 128-byte-swizzle
stores, the wgmma shared-memory descriptors as the kernel builds and advances them (start address,
LBO, SBO, K-major 32-byte k-steps, MN-major 16-row k-steps; reads decoded through the canonical
K-major / MN-major 128B-swizzle layouts that CUTLASS documents for the GMMA descriptor), the
m64nNk16 accumulator fragments (thread t of a warpgroup: rows 16 (warp % 4) + lane / 4 + 8 r,
columns 8 j + 2 (lane % 4) + e at entry 4 j + 2 r + e), the register A fragments of P^T and dS^T,
the masks and per-column LSE / D, the dS^T stores, the dQ adds (the .v4 lane-pair swap at head dim
64) and the dK / dV stores, and compares dQ, dK, dV with torch autograd (fp32 inputs rounded to
fp16). The ordering of asynchronous work (fences, barriers, waits) is not modelled: it checks the
data layout and the arithmetic, not the synchronisation. Keep it in step with the kernel.

The tuning knobs that change layouts are modelled too (--variant, or both in --quick):
KFORGE_FMHA_BWD_SM90_DK_SS (dK += dS^T Q with dS^T read back from its swizzled tile as the
K-major A operand, descriptor of the warpgroup's 64 rows advanced 32 bytes a k-step) and
KFORGE_FMHA_BWD_SM90_DQ_SMEM (each thread's dQ accumulators stored as float2 into its warpgroup's
[64 rows][72 floats] fp32 tile, then per warp lane l < 16 one 64-float row added to the dQ
accumulator: the bulk reduction's source and destination) and KFORGE_FMHA_BWD_SM90_DQ_TMA, the
default kernel (each warp's 16 x 64 dQ tile stored as float2 into two [16 rows][32 floats] boxes
in TMA's 128-byte swizzle, 16-byte chunk c of box row rr at chunk c ^ (rr % 8); each box read back
through that swizzle and added to the 16 accumulator rows from the warp's first, across sequence
and head boundaries as the 2-D tensor map over [heads x rows][d] does, clipped at its end: rows
past the sequence must add zeros).

    python kernels/fmha/scripts/sm90_bwd_model.py [--quick] [--variant dkss,dqsmem,dqtma]  # "ok" or raises
"""

from __future__ import annotations

import functools
import math
import sys

import torch

BN, BM = 128, 64
LOG2E = 1.4426950408889634


def swz(a: int) -> int:
    """Swizzle<3,4,3> on byte addresses: bits 4-6 ^= bits 7-9."""
    return a ^ (((a >> 7) & 7) << 4)


def make_desc(addr: int) -> int:
    return (addr >> 4) | ((1024 >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)


def dec(d: int) -> tuple[int, int, int]:
    assert (d >> 62) == 1 and ((d >> 49) & 7) == 0, "128B swizzle, base offset 0"
    return (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4


def addr_kmajor(d: int, mn: int, k: int) -> int:
    """K-major SW128: ((8,m),(T,2)):((8T,SBO),(1,T)) in 16-byte units."""
    s, _lbo, sbo = dec(d)
    return swz(s + (mn % 8) * 128 + (mn // 8) * sbo + (k // 8) * 16 + (k % 8) * 2)


def addr_mnmajor(d: int, mn: int, k: int) -> int:
    """MN-major SW128: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) in 16-byte units."""
    s, lbo, sbo = dec(d)
    return swz(s + (mn % 64) * 2 + (mn // 64) * lbo + (k % 8) * 128 + (k // 8) * sbo)


class Smem:
    def __init__(self, nbytes: int) -> None:
        self.h = torch.full((nbytes // 2,), float("nan"))  # unwritten reads give NaN

    def operand(self, d: int, rows: int, cols: int, mn_major: bool, a_side: bool) -> torch.Tensor:
        """A [rows = M][cols = K] (a_side) or B [rows = K][cols = N] read through descriptor d."""
        return self.h[operand_index(d, rows, cols, mn_major, a_side)]


@functools.lru_cache(maxsize=None)
def operand_index(d: int, rows: int, cols: int, mn_major: bool, a_side: bool) -> torch.Tensor:
    f = addr_mnmajor if mn_major else addr_kmajor
    idx = torch.empty(rows, cols, dtype=torch.long)
    for i in range(rows):
        for j in range(cols):
            mn, k = (i, j) if a_side else (j, i)
            idx[i, j] = f(d, mn, k) // 2
    return idx


def to_frag(dm: torch.Tensor) -> list[list[float]]:
    """m64nN accumulator -> 128 threads x N / 2 entries."""
    n = dm.shape[1]
    out = []
    for tid in range(128):
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        regs = [0.0] * (n // 2)
        for j in range(n // 8):
            for r in range(2):
                for e in range(2):
                    regs[4 * j + 2 * r + e] = float(dm[16 * warp + g + 8 * r, 8 * j + 2 * t + e])
        out.append(regs)
    return out


def from_frag(fr: list[list[float]], n: int) -> torch.Tensor:
    dm = torch.zeros(64, n)
    for tid in range(128):
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        for j in range(n // 8):
            for r in range(2):
                for e in range(2):
                    dm[16 * warp + g + 8 * r, 8 * j + 2 * t + e] = fr[tid][4 * j + 2 * r + e]
    return dm


def a_from_regs(a: list[list[tuple[float, float]]]) -> torch.Tensor:
    """Register A fragment (per thread 4 packed pairs) -> A [64][16]."""
    am = torch.zeros(64, 16)
    for tid in range(128):
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        for i, (row, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            am[16 * warp + row, col] = a[tid][i][0]
            am[16 * warp + row, col + 1] = a[tid][i][1]
    return am


def rnd(x: float) -> float:
    return float(torch.tensor(x).to(torch.float16).float())


def pack(x: float, y: float) -> tuple[float, float]:
    return (rnd(x), rnd(y))


DQ_ROW = 64 * 4 + 32  # DQ_SMEM: bytes of one padded row of a warpgroup's dQ tile
DQ_WG = BM * DQ_ROW


def cta(p: dict, hdim: int, causal: bool, n_block: int, kv_head: int, b: int,
        dk_ss: bool = False, dq_smem: bool = False, dq_tma: bool = False) -> None:
    kh = hdim // 64
    kv_tile, q_tile = BN * hdim * 2, BM * hdim * 2
    off_k, off_v = 0, kv_tile
    off_q = 2 * kv_tile
    off_do = off_q + 2 * q_tile
    off_ds = off_do + 2 * q_tile
    sbase = 0x400
    sm = Smem(sbase + off_ds + BN * BM * 2)
    lse_s = [[0.0] * BM for _ in range(2)]
    d_s = [[0.0] * BM for _ in range(2)]

    sq, sk = p["sq"][b], p["sk"][b]
    qs, ks = p["q0"][b], p["k0"][b]
    n0 = n_block * BN
    if n0 >= sk:
        return
    m_total = (sq + BM - 1) // BM
    m_first = 0
    if causal:
        r_min = max(0, n0 - (sk - sq))
        m_first = m_total if r_min >= sq else r_min // BM
    m_count = m_total - m_first
    n_iter = m_count * p["ratio"]
    h_first = kv_head * p["ratio"]

    def load_swz(base: int, g: torch.Tensor, row0: int, valid_rows: int, rows: int) -> None:
        chunks = hdim // 8
        rpp = 256 // chunks
        for tid in range(256):
            c, r = tid % chunks, tid // chunks
            dst = base + (c // 8) * (rows * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4)
            for i in range(rows // rpp):
                row = r + i * rpp
                a = (dst + i * rpp * 128) // 2
                vals = g[row0 + row, c * 8:c * 8 + 8] if row < valid_rows else torch.zeros(8)
                sm.h[a:a + 8] = vals

    load_swz(sbase + off_k, p["k"][kv_head], ks + n0, sk - n0, BN)
    load_swz(sbase + off_v, p["v"][kv_head], ks + n0, sk - n0, BN)

    def load_step(it: int, buf: int) -> None:
        h = h_first + it // m_count
        r0 = (m_first + it % m_count) * BM
        load_swz(sbase + off_q + buf * q_tile, p["q"][h], qs + r0, sq - r0, BM)
        load_swz(sbase + off_do + buf * q_tile, p["do"][h], qs + r0, sq - r0, BM)
        for tid in range(BM):
            valid = r0 + tid < sq
            lse_s[buf][tid] = float(p["lse_log2"][h, qs + r0 + tid]) if valid else 0.0
            d_s[buf][tid] = float(p["dpsum"][h, qs + r0 + tid]) if valid else 0.0

    dk = [[[0.0] * 32 for _ in range(kh)] for _ in range(256)]
    dv = [[[0.0] * 32 for _ in range(kh)] for _ in range(256)]
    U = lambda x: x >> 4  # noqa: E731
    k_q_tile_u, k_q_half_u, k_kv_half_u, k_rows16_u = U(q_tile), U(BM * 128), U(BN * 128), U(2048)
    kmaj = lambda kk, hu: (kk // 4) * hu + (kk % 4) * 2  # noqa: E731
    q_desc, do_desc = make_desc(sbase + off_q), make_desc(sbase + off_do)
    k_desc, ds_desc = make_desc(sbase + off_k), make_desc(sbase + off_ds)
    scale_log2 = p["scale"] * LOG2E

    for it in range(n_iter):
        buf = it & 1
        load_step(it, buf)
        h = h_first + it // m_count
        m_block = m_first + it % m_count
        r0 = m_block * BM
        masked = n0 + BN > sk or (causal and n0 + BN - 1 > r0 + sk - sq)
        st_w, dp_w = [], []
        for wg in range(2):
            k_a = make_desc(sbase + off_k + wg * 64 * 128)
            v_a = make_desc(sbase + off_v + wg * 64 * 128)
            st_m = torch.zeros(64, 64)
            dp_m = torch.zeros(64, 64)
            for kk in range(hdim // 16):
                st_m += sm.operand(k_a + kmaj(kk, k_kv_half_u), 64, 16, False, True) @ sm.operand(
                    q_desc + buf * k_q_tile_u + kmaj(kk, k_q_half_u), 16, 64, False, False)
                dp_m += sm.operand(v_a + kmaj(kk, k_kv_half_u), 64, 16, False, True) @ sm.operand(
                    do_desc + buf * k_q_tile_u + kmaj(kk, k_q_half_u), 16, 64, False, False)
            st_w.append(to_frag(st_m))
            dp_w.append(to_frag(dp_m))
        da_all = [None] * 256
        for tid in range(256):
            wg, warp, lane = tid // 128, (tid % 128) // 32, tid % 32
            g, t = lane // 4, lane % 4
            key_l = wg * 64 + warp * 16 + g
            st = st_w[wg][tid % 128]
            dp = dp_w[wg][tid % 128]
            for j in range(8):
                col = 8 * j + 2 * t
                lx, ly = lse_s[buf][col], lse_s[buf][col + 1]
                for r in range(2):
                    key = n0 + key_l + 8 * r
                    for e in range(2):
                        x = 2.0 ** (st[4 * j + 2 * r + e] * scale_log2 - (ly if e else lx))
                        if masked:
                            row = r0 + col + e
                            if key >= sk or (causal and key > row + sk - sq):
                                x = 0.0
                        st[4 * j + 2 * r + e] = x
            da = [[None] * 4 for _ in range(4)]
            for kk in range(4):
                for hi in range(2):
                    j = 2 * kk + hi
                    dx, dy = d_s[buf][8 * j + 2 * t], d_s[buf][8 * j + 2 * t + 1]
                    # (DK_SS keeps no register copy; the model keeps it for the default path)
                    for r in range(2):
                        ds0 = st[4 * j + 2 * r] * (dp[4 * j + 2 * r] - dx)
                        ds1 = st[4 * j + 2 * r + 1] * (dp[4 * j + 2 * r + 1] - dy)
                        da[kk][2 * hi + r] = pack(ds0, ds1)
                        a = sbase + off_ds + (key_l + 8 * r) * 128 + ((j ^ g) << 4) + t * 4
                        sm.h[a // 2] = da[kk][2 * hi + r][0]
                        sm.h[a // 2 + 1] = da[kk][2 * hi + r][1]
            da_all[tid] = da
        for wg in range(2):
            pa = []
            for tl in range(128):
                st = st_w[wg][tl]
                pa.append([[pack(st[8 * kk + 2 * i], st[8 * kk + 2 * i + 1]) for i in range(4)]
                           for kk in range(4)])
            for dh in range(kh):
                acc_v = from_frag([dv[wg * 128 + tl][dh] for tl in range(128)], 64)
                acc_k = from_frag([dk[wg * 128 + tl][dh] for tl in range(128)], 64)
                ds_a = make_desc(sbase + off_ds + wg * 64 * 128)
                for kk in range(4):
                    a_p = a_from_regs([pa[tl][kk] for tl in range(128)])
                    if dk_ss:  # dS^T from its tile: K-major A, 32 bytes (16 queries) a k-step
                        a_d = sm.operand(ds_a + kk * 2, 64, 16, False, True)
                    else:
                        a_d = a_from_regs([da_all[wg * 128 + tl][kk] for tl in range(128)])
                    acc_v += a_p @ sm.operand(do_desc + buf * k_q_tile_u + dh * k_q_half_u +
                                              kk * k_rows16_u, 16, 64, True, False)
                    acc_k += a_d @ sm.operand(q_desc + buf * k_q_tile_u + dh * k_q_half_u +
                                              kk * k_rows16_u, 16, 64, True, False)
                fv, fk = to_frag(acc_v), to_frag(acc_k)
                for tl in range(128):
                    dv[wg * 128 + tl][dh] = fv[tl]
                    dk[wg * 128 + tl][dh] = fk[tl]
        # dQ = dS K
        dq_steps = BN // 16 if hdim == 128 else 4
        for wg in range(2):
            ks0 = 0 if hdim == 128 else wg * 4
            dcol0 = wg * 64 if hdim == 128 else 0
            dq_m = torch.zeros(64, 64)
            for kk in range(dq_steps):
                dq_m += sm.operand(ds_desc + (ks0 + kk) * k_rows16_u, 64, 16, True, True) @ sm.operand(
                    k_desc + (wg if hdim == 128 else 0) * k_kv_half_u + (ks0 + kk) * k_rows16_u,
                    16, 64, True, False)
            fr = to_frag(dq_m)
            acc = p["dq_accum"][h]
            if dq_tma:
                flat = p["dq_accum"].view(-1, hdim)  # the tensor map's [heads x rows][d]
                for warp in range(4):
                    boxes = torch.full((2, 16 * 32), float("nan"))
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        for r in range(2):
                            for j in range(8):
                                byte = ((g + 8 * r) * 128 + (((2 * (j % 4) + t // 2) ^ g) << 4)
                                        + (t % 2) * 8)
                                boxes[j // 4, byte // 4] = fr[warp * 32 + lane][4 * j + 2 * r]
                                boxes[j // 4, byte // 4 + 1] = fr[warp * 32 + lane][4 * j + 2 * r + 1]
                    for bx in range(2):
                        for rr in range(16):
                            grow = h * p["dq_accum"].shape[1] + qs + r0 + 16 * warp + rr
                            if grow >= flat.shape[0]:
                                continue  # clipped by the map
                            vals = torch.stack([boxes[bx, (rr * 128 + ((c ^ (rr % 8)) << 4)) // 4 + e]
                                                for c in range(8) for e in range(4)])
                            assert not torch.isnan(vals).any(), "a box slot no thread wrote"
                            flat[grow, dcol0 + 32 * bx:dcol0 + 32 * bx + 32] += vals
                continue
            if dq_smem:
                # float2 stores of the accumulators into the warpgroup's padded fp32 tile, then
                # lane l < 16 of warp w adds tile row 16 w + l (64 floats) to query row r0 + 16 w + l
                tile = torch.full((DQ_WG // 4,), float("nan"))
                for tl in range(128):
                    warp, lane = tl // 32, tl % 32
                    g, t = lane // 4, lane % 4
                    for r in range(2):
                        for j in range(8):
                            a = ((16 * warp + g + 8 * r) * DQ_ROW + (8 * j + 2 * t) * 4) // 4
                            tile[a] = fr[tl][4 * j + 2 * r]
                            tile[a + 1] = fr[tl][4 * j + 2 * r + 1]
                for warp in range(4):
                    for lane in range(16):
                        row = r0 + 16 * warp + lane
                        if row < sq:
                            src = (16 * warp + lane) * DQ_ROW // 4
                            acc[qs + row, dcol0:dcol0 + 64] += tile[src:src + 64]
                continue
            for tl in range(128):
                warp, lane = tl // 32, tl % 32
                g, t = lane // 4, lane % 4
                dq = fr[tl]
                if hdim == 64:  # the .v4 path: lanes t, t ^ 1 swap halves
                    odd = (t & 1) != 0
                    row = r0 + warp * 16 + g + (8 if odd else 0)
                    partner = fr[warp * 32 + (lane ^ 1)]
                    for j in range(8):
                        x0 = partner[4 * j] if not odd else partner[4 * j + 2]  # what the partner sends
                        x1 = partner[4 * j + 1] if not odd else partner[4 * j + 3]
                        if row < sq:
                            c = dcol0 + 2 * (t & ~1) + 8 * j
                            vals = ([x0, x1, dq[4 * j + 2], dq[4 * j + 3]] if odd
                                    else [dq[4 * j], dq[4 * j + 1], x0, x1])
                            acc[qs + row, c:c + 4] += torch.tensor(vals)
                else:
                    for r in range(2):
                        row = r0 + warp * 16 + g + 8 * r
                        if row < sq:
                            for j in range(8):
                                c = dcol0 + 2 * t + 8 * j
                                acc[qs + row, c] += dq[4 * j + 2 * r]
                                acc[qs + row, c + 1] += dq[4 * j + 2 * r + 1]
    for tid in range(256):
        wg, warp, lane = tid // 128, (tid % 128) // 32, tid % 32
        g, t = lane // 4, lane % 4
        key_l = wg * 64 + warp * 16 + g
        for r in range(2):
            key = n0 + key_l + 8 * r
            if key < sk:
                for dh in range(kh):
                    for j in range(8):
                        c = dh * 64 + j * 8 + 2 * t
                        for e in range(2):
                            p["dk_out"][kv_head][ks + key, c + e] = rnd(dk[tid][dh][4 * j + 2 * r + e] * p["scale"])
                            p["dv_out"][kv_head][ks + key, c + e] = rnd(dv[tid][dh][4 * j + 2 * r + e])


def check(hdim: int, causal: bool, lens_q: list[int], lens_k: list[int], heads: int, heads_k: int,
          dk_ss: bool = False, dq_smem: bool = False, dq_tma: bool = False) -> None:
    torch.manual_seed(hdim + 7 * causal + sum(lens_q))
    tq, tk = sum(lens_q), sum(lens_k)
    f16 = lambda x: x.to(torch.float16).float()  # noqa: E731
    q = f16(torch.randn(heads, tq, hdim))
    k = f16(torch.randn(heads_k, tk, hdim))
    v = f16(torch.randn(heads_k, tk, hdim))
    do = f16(torch.randn(heads, tq, hdim))
    scale = 1.0 / math.sqrt(hdim)
    ratio = heads // heads_k
    q0 = [sum(lens_q[:i]) for i in range(len(lens_q))]
    k0 = [sum(lens_k[:i]) for i in range(len(lens_k))]
    # Reference (autograd, fp64) and the preprocess outputs.
    ref = {n: torch.zeros_like(x, dtype=torch.float64) for n, x in (("dq", q), ("dk", k), ("dv", v))}
    lse_log2 = torch.zeros(heads, tq)
    dpsum = torch.zeros(heads, tq)
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k, strict=True)):
        qq = q[:, q0[b]:q0[b] + sq].double().requires_grad_()
        kk = k[:, k0[b]:k0[b] + sk].double().repeat_interleave(ratio, 0).detach().requires_grad_()
        vv = v[:, k0[b]:k0[b] + sk].double().repeat_interleave(ratio, 0).detach().requires_grad_()
        s = qq @ kk.transpose(1, 2) * scale
        if causal:
            i = torch.arange(sq)[:, None]
            jj = torch.arange(sk)[None, :]
            s = s.masked_fill(jj > i + sk - sq, float("-inf"))
        lse = torch.logsumexp(s, -1)
        pm = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        o = pm @ vv
        o.backward(do[:, q0[b]:q0[b] + sq].double())
        ref["dq"][:, q0[b]:q0[b] + sq] = qq.grad
        ref["dk"][:, k0[b]:k0[b] + sk] = kk.grad.view(heads_k, ratio, sk, hdim).sum(1)
        ref["dv"][:, k0[b]:k0[b] + sk] = vv.grad.view(heads_k, ratio, sk, hdim).sum(1)
        l2 = (lse.detach() * LOG2E).float()
        lse_log2[:, q0[b]:q0[b] + sq] = torch.where(torch.isinf(l2), torch.inf, l2)
        dpsum[:, q0[b]:q0[b] + sq] = (do[:, q0[b]:q0[b] + sq].double() * o.detach()).sum(-1).float()
    p = dict(q=q, k=k, v=v, do=do, scale=scale, ratio=ratio, sq=lens_q, sk=lens_k, q0=q0, k0=k0,
             lse_log2=lse_log2, dpsum=dpsum, dq_accum=torch.zeros(heads, tq, hdim),
             dk_out=torch.full((heads_k, tk, hdim), float("nan")),
             dv_out=torch.full((heads_k, tk, hdim), float("nan")))
    for b in range(len(lens_q)):
        for kvh in range(heads_k):
            for nb in range((max(lens_k) + BN - 1) // BN):
                cta(p, hdim, causal, nb, kvh, b, dk_ss, dq_smem, dq_tma)
    got = {"dq": p["dq_accum"] * scale, "dk": p["dk_out"], "dv": p["dv_out"]}
    for name in ("dq", "dk", "dv"):
        err = (got[name].double() - ref[name]).abs().max().item()
        mag = ref[name].abs().max().item()
        assert err <= 2e-2 * max(1.0, mag), (hdim, causal, lens_q, lens_k, dk_ss, dq_smem, dq_tma, name,
                                             err, mag)
        if "-v" in sys.argv:
            print(hdim, causal, lens_q, lens_k, f"dk_ss={dk_ss} dq_smem={dq_smem} dq_tma={dq_tma}", name,
                  f"max err {err:.2e} (max |ref| {mag:.2f})")


def main() -> None:
    # Partial blocks at both ends, GQA 2:1, causal rows that see no key (sq > sk), sk > sq, a
    # second (varlen) sequence at row and key offsets that are not block multiples. --quick: one
    # case per head dim (the CPU test).
    # --variant dkss,dqsmem,dqtma: those knobs on (every case); --quick: the default kernel's two
    # cases (DQ_TMA), then the fallback kernel's red.global adds, then DK_SS and DQ_SMEM on in the
    # head-dim-128 case (dQ over both warpgroups' keys) and in a head-dim-64 one (each warpgroup's
    # own tile and keys).
    quick = "--quick" in sys.argv
    names = {"dqtma"} if quick else set()
    known = {"dkss", "dqsmem", "dqtma"}
    if "--variant" in sys.argv:
        names = set(sys.argv[sys.argv.index("--variant") + 1].split(","))
        assert names <= known, f"unknown variant(s) {names - known}"
    knobs = {"dk_ss": "dkss" in names, "dq_smem": "dqsmem" in names, "dq_tma": "dqtma" in names}
    for hdim in (64, 128):
        for causal in (True,) if quick else (False, True):
            if not quick or hdim == 64:
                check(hdim, causal, [70, 37], [150, 20], heads=2, heads_k=1, **knobs)
            if not quick or hdim == 128:
                check(hdim, causal, [130], [60], heads=1, heads_k=1, **knobs)
    if quick and "--variant" not in sys.argv:
        check(128, False, [130], [60], heads=1, heads_k=1)
        check(128, False, [130], [60], heads=1, heads_k=1, dk_ss=True, dq_smem=True)
        check(64, True, [70], [150], heads=1, heads_k=1, dk_ss=True, dq_smem=True)
    print("ok")


if __name__ == "__main__":
    main()
