"""kforge.build.makespan: the contention curve, longest-first list scheduling, learning the curve from builds."""

from __future__ import annotations

import pytest

from kforge.build import makespan
from kforge.build.makespan import Contention, default_curve, learn, simulate


def test_default_curve_is_the_h200_measurement() -> None:
    c = default_curve(16)
    assert c.factor(1) == 1.0 and c.factor(8) == 1.0
    assert c.factor(16) == pytest.approx(1.73)
    assert c.factor(12) == pytest.approx(1.365)
    assert c.factor(64) == pytest.approx(1.73)  # flat beyond the last point
    assert "default guess" in c.source


def test_default_curve_on_a_big_host_follows_the_busy_compiles_host_wide() -> None:
    # 64-core H200 host, 2026-11-27: 1.90x at 32 busy compiles and 2.23x at 42, where half the cores were idle
    c = default_curve(64)
    assert c.factor(16) == pytest.approx(1.73) and c.factor(32) == pytest.approx(1.90)
    assert c.factor(42) == pytest.approx(2.23)
    # flat beyond 42: no 64-busy build there ran slower (sm_80 2.16x, the four-arch release build 1.93x)
    assert c.factor(64) == pytest.approx(2.23)
    assert c.factor(128) == pytest.approx(2.23)
    assert c.factor(48) == c.factor(42) and "host-wide" in c.source
    # where both rules agree (up to 16 busy processes) the two hosts get the same factor
    assert [c.factor(n) for n in (4, 8, 12, 16)] == [default_curve(16).factor(n) for n in (4, 8, 12, 16)]


def test_curve_interpolates_between_points() -> None:
    c = Contention(((2.0, 1.0), (4.0, 1.2), (8.0, 2.0)), "t")
    assert [round(c.factor(x), 3) for x in (1, 3, 4, 6, 9)] == [1.0, 1.1, 1.2, 1.6, 2.0]


def test_lpt_schedule_is_longest_first_on_the_freest_lane() -> None:
    s = simulate([("a", 1.0), ("b", 5.0), ("c", 3.0), ("d", 3.0), ("e", 2.0)], 2)
    assert [x.name for x in s.slots] == ["b", "c", "d", "e", "a"]
    assert s.makespan == 7.0  # lanes: b(5)+e(2) | c(3)+d(3)+a(1)
    assert s.busy == 14.0
    assert all(x.end - x.start > 0 for x in s.slots)


def test_long_unit_last_is_what_longest_first_avoids() -> None:
    units = [(f"u{i}", 10.0) for i in range(6)] + [("long", 30.0)]
    file_order = max(20.0 + 30.0, 0)  # 3 lanes: two waves of 10 s, then the long unit alone
    assert simulate(units, 3).makespan == 30.0 < file_order


def test_simulate_rejects_zero_jobs() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        simulate([("a", 1.0)], 0)


def test_learn_from_two_loads() -> None:
    units = {f"u{i}": 10.0 + i for i in range(8)}
    slow = {k: v * 1.43 for k, v in units.items()}
    curve = learn([(8.0, units), (16.0, slow)], cpus=16)
    assert curve is not None
    assert curve.factor(8) == pytest.approx(1.0) and curve.factor(16) == pytest.approx(1.43)
    assert "measured" in curve.source


def test_learn_needs_two_loads_with_common_units() -> None:
    units = {f"u{i}": 10.0 for i in range(8)}
    assert learn([(8.0, units)], cpus=16) is None
    assert learn([(8.0, units), (16.0, {"other": 3.0})], cpus=16) is None
    few = {f"u{i}": 10.0 for i in range(makespan.MIN_COMMON_UNITS - 1)}
    assert learn([(8.0, few), (16.0, few)], cpus=16) is None


def test_cluster_simulation_scales_until_the_longest_unit() -> None:
    flat = Contention(((1.0, 1.0), (64.0, 1.0)), "flat")
    units = [(f"u{i}", 100.0) for i in range(64)] + [("long", 250.0)]
    one = makespan.simulate_cluster(units, makespan.Cluster(1, 16), flat).makespan
    four = makespan.simulate_cluster(units, makespan.Cluster(4, 16), flat).makespan
    assert one == pytest.approx(simulate(units, 16).makespan)
    assert four == 250.0  # 64 lanes: every short unit runs at once; the long one bounds the build
    slow = makespan.simulate_cluster(units, makespan.Cluster(4, 16, per_unit_overhead=5.0, setup_seconds=30.0), flat)
    assert slow.makespan == 30.0 + 255.0
    bound = makespan.simulate_cluster(units, makespan.Cluster(8, 16, per_unit_overhead=10.0, client_cpus=2), flat)
    assert bound.makespan == pytest.approx(65 * 10.0 / 2)  # the client's local part is the bottleneck
    with pytest.raises(ValueError, match="at least one host"):
        makespan.simulate_cluster(units, makespan.Cluster(0, 16), flat)


def test_servers_on_one_host_slow_each_other_down() -> None:
    rising = Contention(((16.0, 1.0), (64.0, 2.0)), "rising")
    units = [(f"u{i}", 100.0) for i in range(64)]
    apart = makespan.simulate_cluster(units, makespan.Cluster(4, 16), rising).makespan
    shared = makespan.simulate_cluster(units, makespan.Cluster(4, 16, shared_host=True), rising).makespan
    assert apart == pytest.approx(100.0)  # four hosts of 16 busy compiles each: c(16)
    assert shared == pytest.approx(200.0)  # one host with 64 busy compiles: c(64)
    one = makespan.simulate_cluster(units, makespan.Cluster(1, 16, shared_host=True), rising).makespan
    assert one == pytest.approx(400.0)  # one server alone on the host: c(16), four rounds
