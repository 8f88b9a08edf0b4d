"""kforge.build.distcluster: the cpu sets of a one-host cluster (the processes are tested in test_sccache_dist.py)."""

from __future__ import annotations

import pytest

from kforge.build import distcluster


def test_cpu_sets_are_disjoint_and_lowest_first() -> None:
    assert distcluster.cpu_sets(4, 16, range(64)) == [tuple(range(i * 16, i * 16 + 16)) for i in range(4)]
    assert distcluster.cpu_sets(2, 2, [7, 3, 5, 1, 9]) == [(1, 3), (5, 7)]


def test_cpu_sets_refuse_more_cpus_than_this_process_may_use() -> None:
    with pytest.raises(ValueError, match="need 64 cpus; this process may use 32"):
        distcluster.cpu_sets(4, 16, range(32))
    with pytest.raises(ValueError, match="at least one server"):
        distcluster.cpu_sets(0, 16, range(32))
