"""A model of the barrier protocol of csrc/fmha_fwd_sm90_tma.cuh, run under random interleavings.

It models the producer thread, the two consumer warpgroups (four warp arrivals each), the TMA
completions (in any order, at any time), the full/empty mbarriers of the K/V ring (phase parity
waits), and, in mode 2, the ping-pong named barriers 4 and 5. For every mode, ring depth and
tile count it checks that nothing deadlocks, that a consumer only reads a buffer that holds the
tile it expects (no TMA write in flight), and that the named barriers end balanced. The
persistent variant (VAR 5, mode 1) is modelled too: one CTA walks several query tiles of
different key-tile counts (0 included), Q has two buffers with full and empty mbarriers, the
K/V ring's index runs on across tiles, and the O epilogue stages through the tile's Q buffer
(so no TMA write of the next-but-one Q may land there before every consumer warp is done).
The dynamic variant (VAR 7, modes 1 and 2) is modelled as well: the producer writes each tile's
index into the slot of the Q buffer it loads before arming that buffer's full barrier, and ends
with -1 in the next slot (a plain arrive, no bytes); the consumers learn each tile from the slot
and stop at -1, and in mode 2 they take turns across tiles with the ping-pong barriers
(warpgroup 1 opens once and never skips an arrive; warpgroup 0 takes the last one at the end). The model
checks that a slot still holds its tile when the consumers release the buffer. With `cross`
(VAR 8, mode 1), a consumer issues the next tile's first Q K^T after its last P V and before
releasing that V and its Q buffer: it waits for the next tile's Q and first K there, which the
model checks can arrive without those releases. With `single_q` (VAR 9, dynamic, modes 1 and 2)
Q has one buffer: each consumer warp releases it once its warpgroup's last Q K^T of the tile has
completed (0 key tiles: at the epilogue), and the epilogue writes O from registers, so it does not
read the buffer; the model checks that no TMA write of the next Q lands before that last product.
With `skew` (FwdParams::kv_skew) the producer loads K(i) then V(i - 1) (the last V after the
loop) instead of K(i) then V(i).
It checks the protocol as written here, not the CUDA code: keep the two in step when either
changes.

    python kernels/fmha/scripts/tma_protocol_model.py      # prints "ok" or raises
"""

from __future__ import annotations

import random


class MBarrier:
    """mbarrier: `count` arrivals plus the expected transaction bytes complete a phase."""

    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phase, self.tx = count, count, 0, 0

    def arrive(self) -> None:
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._maybe_complete()

    def expect_tx(self, nbytes: int) -> None:
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity: int) -> bool:
        """try_wait.parity: the phase of this parity has completed."""
        return (self.phase & 1) != parity


def run(n_blocks: int, stages: int, mode: int, seed: int, tiles: list[int] | None = None,
        dynamic: bool = False, cross: bool = False, single_q: bool = False,
        skew: bool = False) -> None:
    """One CTA: a single query tile of n_blocks key tiles, or (persistent: mode 1, or dynamic:
    modes 1 and 2) `tiles`, the key-tile counts of the tiles it is handed."""
    rng = random.Random(seed)
    assert not cross or (dynamic and mode == 1), "the cross-tile variant is dynamic, mode 1"
    tiles = [n_blocks] if tiles is None else tiles
    persistent = len(tiles) > 1 or dynamic
    assert not persistent or mode == 1 or dynamic, "the static persistent variant is of mode 1"
    assert not single_q or (dynamic and not cross), "the single-Q variant is dynamic, not cross"
    qbufs = 2 if persistent and not single_q else 1
    slot: list = [None] * qbufs  # dynamic: the tile index handed over with each Q buffer
    q_full = [MBarrier(1) for _ in range(qbufs)]
    q_empty = [MBarrier(8) for _ in range(qbufs)]
    q_buf: list = [None] * qbufs
    k_full = [MBarrier(1) for _ in range(stages)]
    v_full = [MBarrier(1) for _ in range(stages)]
    k_empty = [MBarrier(8) for _ in range(stages)]
    v_empty = [MBarrier(8) for _ in range(stages)]
    k_buf: list = [None] * stages
    v_buf: list = [None] * stages
    inflight: list = []  # (barrier, buffer list or None, stage, tile)
    named = {4: {"count": 0, "gen": 0, "arrived": False}, 5: {"count": 0, "gen": 0, "arrived": False}}

    def producer():
        it = 0
        for qi, nb in enumerate(tiles):
            qb = qi % qbufs
            if qi >= qbufs:
                while not q_empty[qb].passed(((qi // qbufs) + 1) & 1):
                    yield
            if dynamic:
                slot[qb] = qi
            q_buf[qb] = "being written"
            q_full[qb].expect_tx(1)
            inflight.append((q_full[qb], q_buf, qb, qi))
            # Base order K(i), V(i); skewed (kv_skew), K(i), V(i - 1), then the last V.
            order = [(i, kv) for i in range(nb) for kv in (0, 1)]
            if skew:
                order = [x for i in range(nb) for x in ([(i, 0)] + ([(i - 1, 1)] if i else []))]
                order += [(nb - 1, 1)] if nb else []
            for i, kv in order:
                g = it + i
                s, parity = g % stages, ((g // stages) + 1) & 1
                full, empty, buf = (k_full, k_empty, k_buf) if kv == 0 else (v_full, v_empty, v_buf)
                if g >= stages:
                    while not empty[s].passed(parity):
                        yield
                buf[s] = "being written"
                full[s].expect_tx(1)
                inflight.append((full[s], buf, s, g))
                yield
            it += nb
        if dynamic:  # no tiles left: -1 through the next Q buffer's slot, a plain arrive
            qi = len(tiles)
            qb = qi % qbufs
            if qi >= qbufs:
                while not q_empty[qb].passed(((qi // qbufs) + 1) & 1):
                    yield
            slot[qb] = -1
            q_full[qb].arrive()

    def bar_arrive(bid: int) -> None:  # bar.arrive bid, 256 by one warpgroup
        b = named[bid]
        assert not b["arrived"], f"second arrive on barrier {bid} before its sync"
        b["arrived"] = True
        b["count"] += 4
        if b["count"] == 8:
            b["count"], b["gen"], b["arrived"] = 0, b["gen"] + 1, False

    def bar_sync(bid: int):  # bar.sync bid, 256 by one warpgroup
        b = named[bid]
        gen = b["gen"]
        b["count"] += 4
        if b["count"] == 8:
            b["count"], b["gen"], b["arrived"] = 0, b["gen"] + 1, False
        while b["gen"] == gen:
            yield

    def consumer(cw: int):
        it = 0
        carried = False
        if dynamic:
            if mode >= 2 and cw == 1:
                bar_arrive(4)  # continuous turns: warpgroup 0 goes first, once
            qi = 0
            while True:
                qb = qi % qbufs
                while not q_full[qb].passed((qi // qbufs) & 1):
                    yield
                tile = slot[qb]
                if tile == -1:
                    if mode >= 2 and cw == 0:
                        yield from bar_sync(4)  # warpgroup 1's arrive after its last turn
                    return
                assert tile == qi, f"slot {qb} holds {tile!r}, not tile {qi}"
                carried = yield from consumer_tile(cw, qi, tiles[tile], it, carried)
                it += tiles[tile]
                qi += 1
        for qi, nb in enumerate(tiles):
            yield from consumer_tile(cw, qi, nb, it)
            it += nb

    def consumer_tile(cw: int, qi: int, n_blocks: int, it0: int, carried: bool = False):
        """One query tile; returns whether it issued the next tile's first Q K^T (cross)."""
        ping_pong, overlap = mode >= 2, mode >= 1
        turns = [n_blocks + 1]
        qb = qi % qbufs

        def turn_begin():
            if ping_pong:
                yield from bar_sync(4 + cw)

        def turn_end():
            if ping_pong:
                turns[0] -= 1
                if dynamic or not (cw == 1 and turns[0] == 0):
                    bar_arrive(4 + (1 - cw))

        def release(bar: MBarrier) -> None:
            for _ in range(4):
                bar.arrive()

        def read(buf: list, i: int) -> None:  # i: the tile's own key-tile index
            g = it0 + i
            assert buf[g % stages] == g, f"stage {g % stages} holds {buf[g % stages]!r}, not tile {g}"

        def read_q() -> None:
            assert q_buf[qb] == qi, f"Q buffer {qb} holds {q_buf[qb]!r}, not query tile {qi}"

        q_released = [False]

        def qk_done(i: int) -> None:
            """Q K^T(i) has completed (read Q to the end); single-Q: the last one frees Q."""
            read_q()
            if single_q and i == n_blocks - 1:
                assert slot[qb] == qi, f"slot {qb} overwritten ({slot[qb]!r}) before tile {qi} ended"
                release(q_empty[qb])
                q_released[0] = True

        def epilogue():
            if single_q:  # O from registers: Q's buffer is not read
                yield
                if not q_released[0]:
                    assert slot[qb] == qi, f"slot {qb} overwritten ({slot[qb]!r}) before tile {qi} ended"
                    release(q_empty[qb])
                return
            # O staged through this tile's Q buffer, then (persistent) handed back to the producer.
            read_q()
            yield
            read_q()
            if dynamic:
                assert slot[qb] == qi, f"slot {qb} overwritten ({slot[qb]!r}) before tile {qi} ended"
            if persistent:
                release(q_empty[qb])

        if ping_pong and not dynamic and cw == 1 and n_blocks > 0:
            bar_arrive(4)
        while not q_full[qb].passed((qi // qbufs) & 1):
            yield
        assert not carried or n_blocks > 0, "a Q K^T carried into a tile without key tiles"
        if not overlap:
            for i in range(n_blocks):
                g = it0 + i
                s, ph = g % stages, (g // stages) & 1
                while not k_full[s].passed(ph):
                    yield
                read_q()
                read(k_buf, i)
                yield
                read(k_buf, i)
                release(k_empty[s])
                qk_done(i)
                while not v_full[s].passed(ph):
                    yield
                read(v_buf, i)
                yield
                read(v_buf, i)
                release(v_empty[s])
            yield from epilogue()
            return False
        if n_blocks == 0:
            yield from epilogue()
            return False
        s0, ph0 = it0 % stages, (it0 // stages) & 1
        if not carried:
            while not k_full[s0].passed(ph0):
                yield
            yield from turn_begin()
            read_q()
            read(k_buf, 0)
            turn_end()
        yield
        read(k_buf, 0)
        release(k_empty[s0])
        qk_done(0)
        for i in range(1, n_blocks):
            g = it0 + i
            s, ph = g % stages, (g // stages) & 1
            ps, pph = (g - 1) % stages, ((g - 1) // stages) & 1
            while not k_full[s].passed(ph):
                yield
            while not v_full[ps].passed(pph):
                yield
            yield from turn_begin()
            read_q()
            read(k_buf, i)
            read(v_buf, i - 1)
            turn_end()
            yield
            read(k_buf, i)
            release(k_empty[s])
            qk_done(i)
            yield
            read(v_buf, i - 1)
            release(v_empty[ps])
        g = it0 + n_blocks - 1
        s, ph = g % stages, (g // stages) & 1
        while not v_full[s].passed(ph):
            yield
        yield from turn_begin()
        read(v_buf, n_blocks - 1)
        turn_end()
        issued = False
        if cross:  # the next tile's first Q K^T, before this V and this Q buffer are released
            nq = qi + 1
            nqb = nq % qbufs
            while not q_full[nqb].passed((nq // qbufs) & 1):
                yield
            nxt = slot[nqb]
            if nxt != -1 and tiles[nxt] > 0:
                g = it0 + n_blocks
                ns, nph = g % stages, (g // stages) & 1
                while not k_full[ns].passed(nph):
                    yield
                assert q_buf[nqb] == nq, f"Q buffer {nqb} holds {q_buf[nqb]!r}, not query tile {nq}"
                assert k_buf[ns] == g, f"stage {ns} holds {k_buf[ns]!r}, not tile {g}"
                issued = True
        yield
        read(v_buf, n_blocks - 1)
        release(v_empty[s])
        yield from epilogue()
        return issued

    actors = {"producer": producer(), "consumer0": consumer(0), "consumer1": consumer(1)}
    for _step in range(200_000):
        if not actors and not inflight:
            break
        choice = rng.choice(list(actors) + (["tma"] if inflight else []))
        if choice == "tma":
            bar, buf, s, tile = inflight.pop(rng.randrange(len(inflight)))
            if buf is not None:
                buf[s] = tile
            bar.complete_tx(1)
        else:
            try:
                next(actors[choice])
            except StopIteration:
                del actors[choice]
    else:
        raise AssertionError(f"deadlock: tiles={tiles} stages={stages} mode={mode} "
                             f"seed={seed}, still waiting: {sorted(actors)}")
    for bid, b in named.items():
        assert b["count"] == 0, f"named barrier {bid} left with {b['count']} arrivals"


def main() -> int:
    for mode in (0, 1, 2):
        for stages in (2, 3):
            for n_blocks in range(0, 10):
                for seed in range(50):
                    run(n_blocks, stages, mode, seed)
    # The persistent variant: several query tiles per CTA, with 0..6 key tiles each.
    for stages in (2, 3, 4):
        for seed in range(300):
            rng = random.Random(1000 + seed)
            tiles = [rng.randrange(0, 7) for _ in range(rng.randrange(2, 7))]
            run(0, stages, 1, seed, tiles=tiles)
    # The dynamic variant, modes 1 and 2: 1-6 tiles (one tile: the -1 arrives right behind it).
    for mode in (1, 2):
        for stages in (2, 3):
            for seed in range(300):
                rng = random.Random(5000 + seed)
                tiles = [rng.randrange(0, 7) for _ in range(rng.randrange(1, 7))]
                run(0, stages, mode, seed, tiles=tiles, dynamic=True)
    # The cross-tile variant (mode 1).
    for stages in (2, 3):
        for seed in range(300):
            rng = random.Random(9000 + seed)
            tiles = [rng.randrange(0, 7) for _ in range(rng.randrange(1, 7))]
            run(0, stages, 1, seed, tiles=tiles, dynamic=True, cross=True)
    # The skewed load order (K(i), V(i - 1)): every mode, one tile, and the dynamic variants.
    for mode in (0, 1, 2):
        for stages in (2, 3):
            for n_blocks in range(0, 8):
                for seed in range(30):
                    run(n_blocks, stages, mode, seed, skew=True)
    for single_q in (False, True):
        for stages in (2, 3):
            for seed in range(300):
                rng = random.Random(17000 + seed)
                tiles = [rng.randrange(0, 7) for _ in range(rng.randrange(1, 7))]
                run(0, stages, 1, seed, tiles=tiles, dynamic=True, single_q=single_q, skew=True)
    # The single-Q variant (modes 1 and 2; mode 0 too, though no path runs it).
    for mode in (0, 1, 2):
        for stages in (2, 3):
            for seed in range(300):
                rng = random.Random(13000 + seed)
                tiles = [rng.randrange(0, 7) for _ in range(rng.randrange(1, 7))]
                run(0, stages, mode, seed, tiles=tiles, dynamic=True, single_q=True)
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
