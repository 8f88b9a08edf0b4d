"""kforge.build.jobs: host facts, profiles, the job choice, OOM detection (the real OOM is in integration)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kforge.build import jobs, makespan, profiles
from kforge.build.host import Resources
from kforge.build.jobs import JobChoice
from kforge.build.measure import UnitMeasure
from kforge.build.profiles import GB, JobProfile
from kforge.errors import BuildError

# ---------------------------------------------------------------------------- choose_jobs

FA = profiles.SEEDS["flash-attn"]


def _host(cpus: int, avail_gb: float) -> Resources:
    return Resources(cpus=cpus, mem_available=int(avail_gb * GB), mem_total=int(avail_gb * GB) + GB)


def test_plenty_of_memory_gives_the_fastest_predicted_build_at_one_thread() -> None:
    choice = jobs.choose_jobs(_host(16, 125), FA)
    assert choice.nvcc_threads == 1 and choice.max_jobs >= 12  # one arch: threads buy nothing
    best = min(jobs.predict(FA, 16, j, 1)[0] for j in range(1, 17))
    assert choice.predicted_seconds is not None and choice.predicted_seconds <= best * (1 + jobs.TIE) + 1e-9
    assert "predicted makespan" in choice.reason


def test_upstream_default_would_have_picked_eight() -> None:
    # min(cpu/2, free_GB/9) on the same host: the baseline of benchmarks/build_jobs.py
    assert min(16 // 2, int(125 / 9)) == 8


@pytest.mark.parametrize("cpus", [1, 2, 8, 16, 64, 128])
@pytest.mark.parametrize("avail", [1.5, 4, 7, 20, 60, 125, 500])
@pytest.mark.parametrize("archs", [1, 2, 3, 5])
def test_choice_never_exceeds_memory_or_cores(cpus: int, avail: float, archs: int) -> None:
    host = _host(cpus, avail)
    profile = profiles.load_profile(Path("/nonexistent"), "flash-attn", archs)
    choice = jobs.choose_jobs(host, profile)
    assert choice.max_jobs >= 1 and choice.nvcc_threads >= 1
    threads_used = min(choice.nvcc_threads, archs)
    assert choice.max_jobs * threads_used <= max(cpus, threads_used)
    budget = host.mem_available - jobs.headroom(host)
    if budget >= jobs.unit_memory(profile, 1):
        assert choice.max_jobs * jobs.unit_memory(profile, choice.nvcc_threads) <= budget
    else:  # not even one unit fits: one job, one thread, and the reason says so
        assert (choice.max_jobs, choice.nvcc_threads) == (1, 1)
        assert "may be OOM-killed" in choice.reason


def test_memory_bound_multi_arch_build_spends_spare_cores_on_threads() -> None:
    profile = profiles.load_profile(Path("/nonexistent"), "flash-attn", 3)
    choice = jobs.choose_jobs(_host(16, 40), profile)
    assert choice.nvcc_threads > 1
    assert "memory-bound" in choice.reason
    assert choice.max_jobs * jobs.unit_memory(profile, choice.nvcc_threads) <= 40 * GB - jobs.headroom(_host(16, 40))


def test_threads_beyond_arch_count_are_never_chosen() -> None:
    profile = profiles.load_profile(Path("/nonexistent"), "flash-attn", 2)
    for avail in (8, 15, 30, 60, 200):
        assert jobs.choose_jobs(_host(32, avail), profile).nvcc_threads <= 2


def test_few_units_use_threads_for_the_tail() -> None:
    profile = profiles.load_profile(Path("/nonexistent"), "flash-attn", 4)
    many = jobs.choose_jobs(_host(16, 125), profile)
    few = jobs.choose_jobs(_host(16, 125), profile, units=2)
    assert many.nvcc_threads == 1
    assert few.nvcc_threads == 4  # two units on 16 cores: the threads would otherwise idle


def test_override_is_honoured_and_flagged_when_too_big() -> None:
    choice = jobs.choose_jobs(_host(16, 20), FA, override_max_jobs=12, override_nvcc_threads=2)
    assert (choice.max_jobs, choice.nvcc_threads) == (12, 2)
    assert "user override" in choice.reason and "WARNING" in choice.reason
    ok = jobs.choose_jobs(_host(16, 125), FA, override_max_jobs=4)
    assert ok.max_jobs == 4 and "WARNING" not in ok.reason
    threads_only = jobs.choose_jobs(_host(16, 125), FA, override_nvcc_threads=1)
    assert threads_only.max_jobs == 16


def test_override_must_be_positive() -> None:
    with pytest.raises(BuildError, match="positive"):
        jobs.choose_jobs(_host(4, 20), FA, override_max_jobs=0)


def test_env_and_halving() -> None:
    c = JobChoice(8, 2, "x", est_peak_memory=8 * GB)
    assert c.env() == {"MAX_JOBS": "8", "NVCC_THREADS": "2", "CMAKE_BUILD_PARALLEL_LEVEL": "8"}
    h = c.halved()
    assert h is not None and (h.max_jobs, h.nvcc_threads) == (4, 2) and h.est_peak_memory == 4 * GB
    one = JobChoice(1, 4, "x").halved()
    assert one is not None and (one.max_jobs, one.nvcc_threads) == (1, 2)
    assert JobChoice(1, 1, "x").halved() is None


# ---------------------------------------------------------------------------- profiles


def test_unknown_project_gets_a_stated_default(tmp_path: Path) -> None:
    p = profiles.load_profile(tmp_path, "newproj", 2)
    assert p.samples == 0 and "default guess" in p.source
    assert p.peak_rss_per_unit == profiles.DEFAULT_PEAK_RSS


def test_flash_attn_seed_comes_from_upstream_facts(tmp_path: Path) -> None:
    p = profiles.load_profile(tmp_path, "flash-attn", 1)
    assert p.peak_rss_per_unit == int(6.3 * GB)
    assert p.unit_seconds == pytest.approx(9678 / 73)
    assert "seed" in p.source
    three = profiles.load_profile(tmp_path, "flash-attn", 3)
    assert three.peak_rss_per_unit == p.peak_rss_per_unit  # memory does not grow with archs
    assert three.unit_seconds > p.unit_seconds  # time does, at one thread


def test_record_then_load_round_trips_and_is_atomic(tmp_path: Path) -> None:
    units = [UnitMeasure("a.o", 10.0, 2 * GB), UnitMeasure("b.o", 30.0, 3 * GB), UnitMeasure("c.o", 20.0, GB)]
    p = profiles.record(tmp_path, "fmha", 2, units)
    assert p.peak_rss_per_unit == 3 * GB
    assert p.unit_seconds == pytest.approx(20.0)
    assert p.samples == 3 and p.source.startswith("measured")
    again = profiles.load_profile(tmp_path, "fmha", 2)
    assert again.peak_rss_per_unit == 3 * GB and again.samples == 3
    data = json.loads((tmp_path / "jobs" / "fmha.json").read_text())
    assert data["project"] == "fmha" and "2" in data["arch_counts"]
    assert not list((tmp_path / "jobs").glob("*.tmp"))
    # a second, lighter build keeps the heavier peak (history max), counts samples
    p2 = profiles.record(tmp_path, "fmha", 2, [UnitMeasure("a.o", 5.0, GB)])
    assert p2.peak_rss_per_unit == 3 * GB and p2.samples == 4


def test_record_normalises_threaded_peaks_and_skips_failures(tmp_path: Path) -> None:
    beta = profiles.DEFAULT_BETA
    units = [UnitMeasure("a.o", 10.0, int(2 * GB * (1 + beta * 3)), nvcc_threads=4),
             UnitMeasure("bad.o", 1.0, 50 * GB, returncode=1)]
    p = profiles.record(tmp_path, "proj", 4, units)
    assert p.peak_rss_per_unit == pytest.approx(2 * GB, rel=1e-6)
    assert profiles.record(tmp_path, "other", 1, [UnitMeasure("x.o", 1.0, 0)]).samples == 0


def test_measured_profile_for_other_arch_count_is_rescaled(tmp_path: Path) -> None:
    profiles.record(tmp_path, "fmha", 1, [UnitMeasure("a.o", 10.0, 2 * GB)])
    p = profiles.load_profile(tmp_path, "fmha", 3)
    assert p.arch_count == 3 and "rescaled" in p.source
    assert p.peak_rss_per_unit == 2 * GB and p.unit_seconds > 10.0


def test_each_build_profile_keeps_its_own_measurements(tmp_path: Path) -> None:
    """FA3's minimal units must not size a full build: a build profile's measurements stay its own."""
    profiles.record(tmp_path, "flash-attn3-standalone", 1, [UnitMeasure("a.o", 100.0, 2 * GB)], build_profile="minimal")
    assert (tmp_path / "jobs" / "flash-attn3-standalone.minimal.json").is_file()
    minimal = profiles.load_profile(tmp_path, "flash-attn3-standalone", 1, "minimal")
    assert minimal.source.startswith("measured") and minimal.peak_rss_per_unit == 2 * GB
    for other in ("full", None):  # the other profile, and a build without one, still get the seed
        seed = profiles.load_profile(tmp_path, "flash-attn3-standalone", 1, other)
        assert seed.source.startswith("seed") and seed.peak_rss_per_unit == 6_572_204 * 1024


def test_the_fa3_standalone_seed_is_the_measured_forward_unit(tmp_path: Path) -> None:
    seed = profiles.load_profile(tmp_path, "flash-attn3-standalone", 1, "full")
    assert (seed.peak_rss_per_unit, seed.unit_seconds_max, seed.samples) == (6_572_204 * 1024, 252.16, 0)
    assert seed.unit_seconds == pytest.approx(247.6, abs=0.1)  # the two measured forward units' mean
    assert "hdim128 bf16 (+split) sm_90a" in seed.source and "2026-11-27" in seed.source
    # on this 2-core 24 GB build machine: both cores, 12.5 GiB of the ~16 GiB it has after headroom
    choice = jobs.choose_jobs(Resources(2, 18 * 2**30, 24 * 2**30), seed, units=23)
    assert (choice.max_jobs, choice.nvcc_threads) == (2, 1) and "23 units of 248 s" in choice.reason


def test_a_unit_count_other_than_the_seeds_is_estimated_from_the_count() -> None:
    """flash-attn's seed holds the 73 unit times of one build: a build of 73 uses them, a build of 10 does not."""
    same = jobs.choose_jobs(_host(16, 125), FA, units=73)
    assert same.reason == jobs.choose_jobs(_host(16, 125), FA).reason and "seed's 73 unit times" in same.reason
    fewer = jobs.choose_jobs(_host(16, 125), FA, units=10)
    assert "estimate: 10 units of" in fewer.reason and fewer.max_jobs <= 10


def test_corrupt_profile_file_falls_back(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "flash-attn.json").write_text("{not json")
    assert "seed" in profiles.load_profile(tmp_path, "flash-attn", 1).source


def test_profile_dataclass_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        FA.peak_rss_per_unit = 1  # type: ignore[misc]
    assert isinstance(FA, JobProfile)


def test_damaged_profile_file_counts_as_not_measured(tmp_path) -> None:
    from kforge.build.profiles import load_profile

    path = tmp_path / "jobs" / "fmha.json"
    path.parent.mkdir()
    path.write_text('{"arch_counts": {"1": {}, "x": {"peak_rss_per_unit": 1}, "2": {"unit_seconds": "soon"}}}')
    profile = load_profile(tmp_path, "fmha", 1)
    assert profile.source.startswith("default guess")


# ---------------------------------------------------------------------------- makespan model, unit times, contention


def _measured(units: dict[str, float], *, archs: int = 1, load: float = 8.0, threads: int = 1,
              contention: makespan.Contention | None = None) -> JobProfile:
    return dataclasses.replace(FA, arch_count=archs, source="measured (test)", contention=contention,
                               unit_builds=((load, threads, tuple(sorted(units.items()))),))


def test_record_keeps_unit_times_and_learns_the_host_contention(tmp_path: Path) -> None:
    def build(scale: float) -> list[UnitMeasure]:
        return [UnitMeasure(f"/scratch{scale}/build/temp.x/csrc/u{i}.o", (10.0 + i) * scale, 4 * GB) for i in range(32)]

    first = profiles.record(tmp_path, "flash-attn", 1, build(1.0), jobs=8, cpus=16)
    assert first.contention is None  # one load seen: the default curve still applies
    assert dict(jobs.unit_times(first, 16))["build/temp.x/csrc/u7.o"] == pytest.approx(17.0)
    second = profiles.record(tmp_path, "flash-attn", 1, build(1.43), jobs=16, cpus=16)
    assert second.contention is not None and second.contention.factor(16) == pytest.approx(1.43)
    loaded = profiles.load_profile(tmp_path, "flash-attn", 1)
    assert loaded.contention == second.contention and loaded.unit_count == 32
    # the latest build's times, divided by this host's factor at its load: back to the uncontended times
    assert dict(jobs.unit_times(loaded, 16))["build/temp.x/csrc/u7.o"] == pytest.approx(17.0)
    assert jobs.unit_times(loaded, 16)[0][0] == "build/temp.x/csrc/u31.o"  # longest first
    assert json.loads((tmp_path / "jobs" / "host.json").read_text())["points"][1] == [16.0, pytest.approx(1.43)]


def test_record_without_jobs_keeps_no_unit_times(tmp_path: Path) -> None:
    p = profiles.record(tmp_path, "x", 1, [UnitMeasure("a.o", 5.0, GB)])
    assert p.unit_builds == () and jobs.unit_times(p, 4) == ()


def test_one_long_unit_bounds_the_build_so_fewer_jobs_win() -> None:
    profile = _measured({"long.o": 300.0, **{f"s{i}.o": 10.0 for i in range(10)}})
    choice = jobs.choose_jobs(_host(16, 125), profile)
    assert choice.max_jobs == 2 and choice.nvcc_threads == 1  # 300 s either way: fewest processes
    assert choice.predicted_seconds == pytest.approx(300.0)
    assert "bound by its longest unit, long.o at 300 s" in choice.reason
    assert "LPT schedule of 11 measured units" in choice.reason
    assert [k for k, _ in choice.order][0] == "long.o"


def test_steep_contention_stops_short_of_every_core() -> None:
    steep = makespan.Contention(((4.0, 1.0), (16.0, 4.0)), "measured (test)")
    profile = _measured({f"u{i}.o": 100.0 for i in range(64)}, contention=steep, load=4.0)
    choice = jobs.choose_jobs(_host(16, 500), profile)
    assert choice.max_jobs < 16
    best = min(jobs.predict(profile, 16, j, 1)[0] for j in range(1, 17))
    assert choice.predicted_seconds == pytest.approx(best, rel=jobs.TIE)


def test_default_curve_still_fills_the_cores_for_flash_attn_shaped_units() -> None:
    # 72 units like the H200 run's (fwd ~120 s, bwd ~170 s, a few long fwd_split): the default curve says 16 x 1
    units = {**{f"fwd{i}.o": 120.0 for i in range(40)}, **{f"bwd{i}.o": 170.0 for i in range(24)},
             **{f"split{i}.o": 240.0 for i in range(8)}}
    choice = jobs.choose_jobs(_host(16, 125), _measured(units))
    assert (choice.max_jobs, choice.nvcc_threads) == (16, 1)
    eight = jobs.predict(_measured(units), 16, 8, 1)[0]
    assert choice.predicted_seconds is not None and choice.predicted_seconds < eight


def test_a_64_core_host_does_not_fill_its_cores_with_flash_attn() -> None:
    # the seed's 73 units on a 64-core, 540 GB host: every unit runs 2.23x slower from 42 busy compiles on
    # (host-wide contention), so the choice stops where the longest unit bounds the build (the 2026-11-27 run:
    # 42 jobs, 559 s in ninja); more jobs would be no faster, and the fewest processes win the tie
    choice = jobs.choose_jobs(_host(64, 540), FA)
    assert 36 <= choice.max_jobs <= 48 and choice.nvcc_threads == 1
    assert choice.predicted_seconds is not None
    assert choice.predicted_seconds <= jobs.predict(FA, 64, 64, 1)[0]
    assert choice.predicted_seconds < jobs.predict(FA, 64, 32, 1)[0]
    # the plan says why more jobs would not help: one unit is the whole build
    assert "bound by its longest unit, flash_fwd_split_hdim64_fp16_sm80.o at" in choice.reason
    assert "#" not in choice.reason.split(":")[0] and "bound by its longest unit" in jobs.jobs_sentence(choice)


def test_the_four_arch_release_build_is_predicted_near_its_measurement() -> None:
    # flash-attn-release (sm_80 sm_90 sm_100 sm_120) on the 64-core H200 host, 2026-11-28: 32 jobs x 2 nvcc
    # threads, 1,090.7 s in ninja. The model (seed, rescaled to 4 archs, default curve) said 1,732 s while the curve
    # rose beyond 42 busy compiles; flat there, it is within 25 %, still above (the seed prices every arch as sm_90)
    # rose beyond 42 busy compiles; flat there, 1,306 s with every arch priced as sm_90 (the seed's arch)
    unweighted = jobs.predict(profiles.for_arch_count(FA, 4), 64, 32, 2)[0]
    assert 1090.7 < unweighted < 1.25 * 1090.7
    # priced with the single-arch builds' weights (sm_100 and sm_120 units are cheaper): within 5 %
    four = profiles.for_arch_count(FA, 4, archs=(80, 90, 100, 120))
    assert four.weighted_archs == pytest.approx(3.15, abs=0.01) and "sm_100 0.569" in four.source
    assert abs(jobs.predict(four, 64, 32, 2)[0] / 1090.7 - 1) < 0.05
    # and the plan's own choice on that host is 32 x 2: one device compile per core, no more
    choice = jobs.choose_jobs(_host(64, 540), four)
    assert (choice.max_jobs, choice.nvcc_threads) == (32, 2)


def test_arch_weights_price_a_single_arch_seed_and_leave_measured_profiles_alone() -> None:
    sm100 = profiles.for_arch_count(FA, 1, archs=(100,))
    # a unit's time is s + (1 - s) w of the seed's: 0.3 + 0.7 x 0.569 = 0.698 (15,033 / 21,534.5 measured)
    assert sm100.unit_seconds == pytest.approx(FA.unit_seconds * 0.6983, rel=1e-3)
    assert profiles.for_arch_count(FA, 1, archs=(90,)).unit_seconds == pytest.approx(FA.unit_seconds)
    assert profiles.for_arch_count(FA, 1, archs=(89,)).unit_seconds == pytest.approx(FA.unit_seconds)  # unlisted: 1.0
    measured = _measured({f"u{i}.o": 100.0 for i in range(8)})
    assert profiles.for_arch_count(measured, 1, archs=(100,)) == measured


def test_threads_pay_only_with_more_than_one_arch() -> None:
    few = {"a.o": 200.0, "b.o": 200.0}
    one_arch = jobs.choose_jobs(_host(16, 125), _measured(few, archs=1))
    assert one_arch.nvcc_threads == 1
    assert jobs.predict(_measured(few), 16, 2, 4)[0] == jobs.predict(_measured(few), 16, 2, 1)[0]
    three = jobs.choose_jobs(_host(16, 125), _measured(few, archs=3))
    assert three.nvcc_threads == 3 and three.max_jobs == 2


def test_plan_line_says_upstream_order_until_measured(tmp_path: Path) -> None:
    unknown = profiles.load_profile(tmp_path, "no-such-project", 1)
    assert "upstream's" in jobs.order_line(jobs.choose_jobs(_host(16, 125), unknown))
    seeded = jobs.order_line(jobs.choose_jobs(_host(16, 125), FA))
    assert "seed's 73 unit times" in seeded and "longest flash_fwd_split_hdim64_fp16_sm80.o" in seeded
    measured = jobs.choose_jobs(_host(16, 125), _measured({"a.o": 5.0, "b.o": 9.0}))
    assert jobs.order_line(measured).startswith("longest first") and "b.o, 9 s" in jobs.order_line(measured)


def test_override_gets_a_prediction_too() -> None:
    choice = jobs.choose_jobs(_host(16, 125), _measured({"a.o": 100.0, "b.o": 100.0, "c.o": 100.0}),
                              override_max_jobs=2)
    assert choice.predicted_seconds == pytest.approx(200.0)


def test_a_per_unit_overhead_lengthens_every_unit_it_schedules() -> None:
    units = _measured({"a.o": 100.0, "b.o": 100.0, "c.o": 100.0})
    plain = jobs.choose_jobs(_host(16, 125), units, override_max_jobs=2)
    host = dataclasses.replace(_host(16, 125), unit_overhead=25.0)
    slow = jobs.choose_jobs(host, units, override_max_jobs=2)
    assert slow.predicted_seconds == pytest.approx(plain.predicted_seconds + 2 * 25.0)  # two units on one slot
    assert "25.0 s a unit outside the compilers" in slow.reason


def test_flash_attn_seed_is_the_h200_builds_unit_times() -> None:
    assert len(FA.seed_units) == 73 and all(n == 1 for _, _, n in FA.seed_units)
    at_16 = sum(sec for _, sec, _ in FA.seed_units) * makespan.DEFAULT_FULL_LOAD_FACTOR
    assert at_16 == pytest.approx(16702, abs=1)  # what that build's 73 units summed to at 16 jobs
    order = [name for name, _ in jobs.unit_times(FA, 16)]
    assert order[0] == "flash_fwd_split_hdim64_fp16_sm80.o" and order[-1] == "flash_api.o"
    seconds, schedule, how = jobs.predict(FA, 16, 16, 1)
    assert how.startswith("estimate: LPT schedule of the seed's 73 unit times") and schedule is not None
    assert len(schedule.slots) == 73 and seconds >= 432.9 - 0.1  # the longest unit alone, at c(16)
    choice = jobs.choose_jobs(_host(16, 125), FA)
    assert choice.order_from == "seed" and dict(choice.order)["flash_api.o"] == pytest.approx(38.8 / 1.73)
    # once this host measured units, the seed no longer orders anything
    measured = _measured({"a.o": 1.0})
    assert dataclasses.replace(measured, seed_units=FA.seed_units).unit_builds and jobs.unit_times(
        dataclasses.replace(measured, seed_units=FA.seed_units), 16) == (("a.o", 1.0),)


def test_a_build_with_fewer_units_than_two_per_job_teaches_no_contention(tmp_path: Path) -> None:
    # fmha has 7 units: under MAX_JOBS=16 it never ran 16 at once. Recording it at 16 and at 8 jobs with equal
    # times once made host.json say "no slowdown at 16 jobs", and flash-attn's plan then predicted 647 s.
    units = [UnitMeasure(f"/s/build/u{i}.o", 10.0 + i, GB) for i in range(7)]
    profiles.record(tmp_path, "fmha", 1, units, jobs=16, cpus=16)
    small = profiles.record(tmp_path, "fmha", 1, units, jobs=8, cpus=16)
    assert len(small.unit_builds) == 2 and small.contention is None  # kept for the order, not for contention
    assert not (tmp_path / "jobs" / "host.json").exists()
    assert small.samples == 14  # the units still count for memory and time per unit
