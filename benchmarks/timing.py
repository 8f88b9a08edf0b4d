"""Device timing shared by the attention benchmarks (fmha_vs_sdpa.py, fmha_tail.py,
fa3_standalone_vs_torch.py): calls timed in interleaved rounds with CUDA events, and the FLOP
count their TFLOP/s divide. Needs torch; imports no kernel library.
"""

from __future__ import annotations

import random
import statistics
import zlib

import torch


def gpu_lead(cycles: int = 1_000_000) -> None:
    """Keeps the GPU busy for `cycles` clock cycles (torch.cuda._sleep: a spin kernel; 1e6 cycles
    is 0.5-0.6 ms at 1.7-2 GHz), so that the calls queued right after it are timed on the GPU
    alone, without their launch cost."""
    torch.cuda._sleep(cycles)


def shape_seed(*shape) -> int:
    """A seed of its own for each shape's round orders (one seed for all shapes gives every shape
    the same orders, and their bias with them: run 28)."""
    return zlib.crc32(" ".join(str(x) for x in shape).encode())


def time_interleaved(fns: dict, warmup: int, runs: int, order: str = "shuffle",
                     seed: int = 0) -> dict:
    """Median device time of one call of each function, timed in rounds: every round calls each
    function once, with CUDA events around each call and no sync inside a round. GPU clocks move
    with power draw during a run (the H200 ran from 1560 to 1980 MHz inside one benchmark,
    nvidia-smi at 250 ms), so timing one backend's calls after another's lets a clock drift
    decide a ratio; rounds spread it over all of them.
    order "rotate": each round starts one further along the list, so a column always follows the
    same column (except when it is first), and its place in the order moves its reading: in runs
    22-26 (docs/benchmarks.md) kforge's "default" column, which followed the "wgmma" column, read
    0.1-3.3% below a column running the same kernel elsewhere in the list, in 59 of 60 pairs.
    order "shuffle" (the default): blocks of len(fns) rounds; each block draws a random order
    (random.Random(seed)) and rotates it by one per round, so inside a block every column takes
    every place once, and the column before it changes from block to block.
    Each round starts behind a short GPU sleep (gpu_lead), so that its first call's start event
    is recorded while the GPU is busy: else the first call of a round, on an idle GPU, is timed
    with its host-side launch cost (68-140 us for kforge_fmha, 14-28 us for SDPA in runs 22-30).
    A function that raises RuntimeError in its warm-up gets its error string instead."""
    if order not in ("rotate", "shuffle"):
        raise ValueError(f"order is {order!r}; use 'rotate' or 'shuffle'")
    out, ok = {}, {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
        except RuntimeError as exc:  # backend refuses this shape
            out[name] = str(exc).splitlines()[0][:80]
            continue
        ok[name] = fn
    names = list(ok)
    events = {n: [] for n in names}
    rng = random.Random(seed)
    base = list(names)
    for r in range(runs):
        if order == "shuffle" and r % len(names) == 0:
            base = rng.sample(names, len(names))
        round_names = [base[(r + i) % len(base)] for i in range(len(base))]
        gpu_lead()
        for n in round_names:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            ok[n]()
            e.record()
            events[n].append((s, e))
        torch.cuda.synchronize()  # one round at a time: the events of a round are few
    for n in names:
        out[n] = statistics.median(s.elapsed_time(e) for s, e in events[n])
    return out


def flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> float:
    f = 4.0 * batch * heads * seqlen * seqlen * head_dim
    return f / 2 if causal else f
