"""benchmarks/timing.py's interleaved timing (used by fmha_vs_sdpa.py, fmha_tail.py and
fa3_standalone_vs_torch.py), with fake CUDA events: every column is called warm-up + runs times,
each round starts behind a GPU lead and calls every column once (in blocks of rounds that give
every column every place once, in an order drawn from the seed, or rotated by one per round), the
medians are each column's own times, and a column whose warm-up raises gets its error instead of
a time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the benchmarks' timing needs torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("timing", ROOT / "benchmarks" / "timing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    clock = {"t": 0.0}

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = None

        def record(self) -> None:
            self.t = clock["t"]

        def elapsed_time(self, end: "FakeEvent") -> float:
            return end.t - self.t

    monkeypatch.setattr(mod.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(mod.torch.cuda, "synchronize", lambda: None)
    leads: list[float] = []
    monkeypatch.setattr(mod, "gpu_lead", lambda: leads.append(clock["t"]))
    clock["leads"] = leads
    return mod, clock


def test_rounds_rotate_and_medians_are_each_columns_own(bench) -> None:
    mod, clock = bench
    calls: list[str] = []
    cost = {"a": 1.0, "b": 2.0, "c": 5.0}

    def make(name):
        def fn():
            calls.append(name)
            clock["t"] += cost[name]
        return fn

    out = mod.time_interleaved({n: make(n) for n in cost}, warmup=2, runs=4, order="rotate")
    assert out == pytest.approx(cost)
    assert {n: calls.count(n) for n in cost} == {"a": 6, "b": 6, "c": 6}
    timed = calls[6:]  # after the warm-ups (2 per column, column by column)
    rounds = [timed[i:i + 3] for i in range(0, 12, 3)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def _timed_rounds(mod, clock, names, runs, seed):
    calls: list[str] = []
    cost = {n: float(i + 1) for i, n in enumerate(names)}

    def make(name):
        def fn():
            calls.append(name)
            clock["t"] += cost[name]
        return fn

    out = mod.time_interleaved({n: make(n) for n in names}, warmup=1, runs=runs, seed=seed)
    assert out == pytest.approx(cost)
    timed = calls[len(names):]
    return [timed[i:i + len(names)] for i in range(0, len(timed), len(names))]


def test_shuffled_rounds_are_balanced_blocks_that_vary_each_columns_predecessor(bench) -> None:
    mod, clock = bench
    names = ["wgmma", "default", "fs", "flash", "cudnn"]
    rounds = _timed_rounds(mod, clock, names, runs=40, seed=0)
    assert len(rounds) == 40
    assert len(clock["leads"]) == 40  # every round behind its own GPU lead
    assert all(sorted(r) == sorted(names) for r in rounds)
    for b in range(0, 40, len(names)):  # each block: every column at every place once
        block = rounds[b:b + len(names)]
        for place in range(len(names)):
            assert sorted(r[place] for r in block) == sorted(names)
    # the same seed gives the same rounds; another seed other ones
    assert _timed_rounds(mod, clock, names, runs=40, seed=0) == rounds
    assert _timed_rounds(mod, clock, names, runs=40, seed=1) != rounds
    # unlike rotation, a column does not always follow the same one
    for n in names:
        before = {r[r.index(n) - 1] for r in rounds if r.index(n) > 0}
        assert len(before) >= 3, (n, before)


def test_unknown_order_is_refused(bench) -> None:
    mod, _ = bench
    with pytest.raises(ValueError, match="rotate"):
        mod.time_interleaved({"a": lambda: None}, warmup=0, runs=1, order="sorted")


def test_a_column_that_refuses_the_shape_gets_its_error(bench) -> None:
    mod, clock = bench

    def ok():
        clock["t"] += 3.0

    def refuses():
        raise RuntimeError("No available kernel. Aborting execution.\nmore detail")

    out = mod.time_interleaved({"ok": ok, "cudnn": refuses}, warmup=1, runs=3)
    assert out["ok"] == pytest.approx(3.0)
    assert out["cudnn"] == "No available kernel. Aborting execution."
