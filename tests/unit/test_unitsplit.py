"""kforge.build.unitsplit: long units cut in parts, the job choice both ways, and the plan's decision."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from kforge.build import jobs, profiles, unitsplit
from kforge.build.host import HostFacts, Resources
from kforge.build.profiles import GB, load_profile
from kforge.config.forge import load_forge
from kforge.config.model import UnitGroup, UnitSplit
from kforge.config.targets import parse_target
from kforge.errors import ConfigError
from kforge.plan import PlanOptions, make_plan

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = """
[platforms.linux-x86_64]
os = "linux"

[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_90a"]
"""
RULE = UnitSplit(env="SPLIT", groups=(
    UnitGroup(units="long_*.o", exclude="*_causal*", parts=(("_m", 0.1), ("_a", 0.6), ("_b", 0.5))),
    UnitGroup(units="bwd_*.o", parts=(("_m", 0.2), ("_d0", 0.9))),
))


def test_cut_and_whole_translate_between_the_two_builds() -> None:
    units = (("obj/long_1.o", 100.0), ("obj/long_1_causal.o", 80.0), ("obj/short.o", 10.0), ("obj/bwd_1.o", 50.0))
    cut = unitsplit.cut(units, RULE)
    assert cut == (("obj/long_1_m.o", 10.0), ("obj/long_1_a.o", 60.0), ("obj/long_1_b.o", 50.0),
                   ("obj/long_1_causal.o", 80.0), ("obj/short.o", 10.0), ("obj/bwd_1_m.o", 10.0), ("obj/bwd_1_d0.o", 45.0))
    back = dict(unitsplit.whole(cut, RULE))  # "_m" is a suffix of both groups: each part finds its own whole unit
    assert back == {"obj/long_1.o": pytest.approx(100.0), "obj/long_1_causal.o": 80.0, "obj/short.o": 10.0,
                    "obj/bwd_1.o": pytest.approx(50.0)}
    assert unitsplit.cut(cut, RULE) == cut  # a cut build's times cut again: unchanged
    measured = (("long_1_m.o", 20.0), ("long_1_a.o", 70.0), ("long_1_b.o", 40.0), ("bwd_1_m.o", 5.0))
    assert unitsplit.cut(measured, RULE) == measured[:3]  # measured parts kept as measured; an incomplete set dropped


def test_a_part_without_its_siblings_is_dropped_not_taken_for_the_whole_unit() -> None:
    assert unitsplit.whole((("long_1_a.o", 60.0), ("x.o", 1.0)), RULE) == (("x.o", 1.0),)


def _host(cpus: int, avail_gb: float) -> Resources:
    return Resources(cpus=cpus, mem_available=int(avail_gb * GB), mem_total=int(avail_gb * GB) + GB)


def _decide(cpus: int, mode: str = "auto"):
    forge = load_forge(ROOT)
    rule = forge.projects["flash-attn"].unit_split
    assert rule is not None
    return unitsplit.decide(rule, mode, profiles.SEEDS["flash-attn"], 73,
                            lambda prof, n: jobs.choose_jobs(_host(cpus, 8 * cpus), prof, units=n))


def test_flash_attn_is_cut_on_64_cores_and_kept_whole_on_32_and_16() -> None:
    """The seed's 73 units: on 64 cores the longest unit (flash_fwd_split_hdim64_fp16_sm80, 558 s predicted at 42
    busy compiles) is the build; cut, the floor is a backward unit and the build is predicted >= 5% shorter. On 32
    and 16 cores the units fill the slots either way, and the cut's extra header passes only cost time (measured on
    32 cores, 2026-11-28: 749.3 s cut against 640.6 s whole)."""
    wide, said = _decide(64)
    assert said is not None and said.split and said.env == {"FLASH_ATTN_KFORGE_SPLIT_UNITS": "1"}
    whole_seconds = jobs.choose_jobs(_host(64, 512), profiles.SEEDS["flash-attn"], units=73).predicted_seconds
    assert wide.predicted_seconds is not None and whole_seconds is not None
    assert wide.predicted_seconds <= whole_seconds * (1 - unitsplit.MIN_GAIN)
    assert "flash_fwd_split_hdim64_fp16_sm80_kfpart00.o" in dict(wide.order)
    assert "flash_fwd_split_hdim64_fp16_sm80.o" not in dict(wide.order)
    assert "(127 units)" in said.line  # 73 + 12 x 4 + 2 x 3
    assert "flash_bwd_hdim256_fp16_sm80_kfpart2.o" in dict(wide.order)
    assert [s for _, s in wide.order] == sorted((s for _, s in wide.order), reverse=True)  # longest first
    for cpus in (32, 16):
        narrow, kept = _decide(cpus)
        assert kept is not None and not kept.split and kept.env == {"FLASH_ATTN_KFORGE_SPLIT_UNITS": "0"}
        assert "flash_fwd_split_hdim64_fp16_sm80.o" in dict(narrow.order)


def test_on_and_off_override_the_prediction() -> None:
    _, on = _decide(16, "on")
    assert on is not None and on.split and on.line.startswith("on (--split-units on)")
    _, off = _decide(64, "off")
    assert off is not None and not off.split and off.env == {"FLASH_ATTN_KFORGE_SPLIT_UNITS": "0"}


def test_a_measured_cut_build_is_read_back_as_whole_units_for_the_whole_prediction(tmp_path: Path) -> None:
    from kforge.build.measure import UnitMeasure

    measured = {"long_1_m.o": 24.0, "long_1_a.o": 200.0, "long_1_b.o": 136.0, "short.o": 50.0}  # not the shares' mix
    cut = [UnitMeasure(output=f"b/{k}", seconds=s, peak_rss=GB, returncode=0, nvcc_threads=1) for k, s in measured.items()]
    prof = profiles.record(tmp_path, "demo", 1, cut, jobs=4)
    assert dict(unitsplit.reshape(prof, RULE, split=False).unit_builds[-1][2]) == {
        "b/long_1.o": pytest.approx(360.0 / 1.2), "b/short.o": 50.0}
    assert unitsplit.extra_units(2, unitsplit.reshape(prof, RULE, split=False), RULE) == 4
    parts = dict(unitsplit.reshape(prof, RULE, split=True).unit_builds[-1][2])  # the cut prediction: as measured
    assert parts == {f"b/{k}": v for k, v in measured.items()}


def test_the_plan_prints_the_decision_and_sets_the_variable() -> None:
    forge = load_forge(ROOT)
    facts = dict(platform="linux-x86_64", python="3.11", cuda_version=Version("13.0.88"),
                 nvcc_path="/usr/local/cuda-13.0/bin/nvcc", cuda_home="/usr/local/cuda-13.0",
                 nvcc_archs=frozenset({"compute_90"}), torch_version=Version("2.11.0"))
    seed = load_profile(Path("/nonexistent-kforge-cache"), "flash-attn", 1)

    def plan(cpus: int, **opts):
        h = HostFacts(resources=_host(cpus, 8 * cpus), **facts)
        return make_plan(forge, parse_target(forge, "flash-attn-sm90", h.platform), h, PlanOptions(**opts),
                         job_profile=seed)

    wide = plan(64)
    assert wide.env["FLASH_ATTN_KFORGE_SPLIT_UNITS"] == "1"
    assert "\n  split       FLASH_ATTN_KFORGE_SPLIT_UNITS=1: the longest units cut in parts, predicted" in wide.render()
    assert wide.to_dict()["jobs"]["split"].startswith("FLASH_ATTN_KFORGE_SPLIT_UNITS=1")
    assert plan(16).env["FLASH_ATTN_KFORGE_SPLIT_UNITS"] == "0"
    assert plan(64, split_units="off").env["FLASH_ATTN_KFORGE_SPLIT_UNITS"] == "0"
    fmha = make_plan(forge, parse_target(forge, "fmha-sm90", "linux-x86_64"),
                     HostFacts(resources=_host(64, 512), **facts), PlanOptions(),
                     job_profile=load_profile(Path("/nonexistent-kforge-cache"), "fmha", 1))
    assert "\n  split " not in fmha.render() and fmha.to_dict()["jobs"]["split"] is None


@pytest.mark.parametrize("table, wrong", [
    ('{ env = "", groups = [{ units = "a*.o", parts = { _a = 0.5, _b = 0.6 } }] }', "needs env"),
    ('{ env = "S", groups = [] }', "one or more groups"),
    ('{ env = "S", groups = [{ units = "", parts = { _a = 0.5, _b = 0.6 } }] }', r"groups\[0\]\.units"),
    ('{ env = "S", groups = [{ units = "a*.o", parts = { _a = 0.5 } }] }', "two or more"),
    ('{ env = "S", groups = [{ units = "a*.o", parts = { _a = 0.5, _b = 1.5 } }] }', "0 < share <= 1"),
])
def test_a_bad_unit_split_is_refused_naming_the_key(tmp_path: Path, table: str, wrong: str) -> None:
    (tmp_path / "forge.toml").write_text(MINIMAL + f"unit_split = {table}\n")
    with pytest.raises(ConfigError, match=wrong):
        load_forge(tmp_path)


def test_the_build_is_checked_against_the_plans_split() -> None:
    from kforge.build.measure import UnitMeasure
    from kforge.errors import BuildError

    def built(*names: str) -> list[UnitMeasure]:
        return [UnitMeasure(output=f"build/temp/{n}", seconds=1.0, peak_rss=GB) for n in names]

    cut = built("long_1_m.o", "long_1_a.o", "long_1_b.o", "short.o")
    assert unitsplit.confirm(RULE, (("SPLIT", "1"),), cut) == \
        "split: 3 parts of cut units and 1 other units compiled, as the plan said (SPLIT=1)"
    assert unitsplit.confirm(RULE, (("SPLIT", "0"),), built("long_1.o", "short.o")).startswith("split: units compiled whole")
    with pytest.raises(BuildError, match="the plan said SPLIT=1, but the build compiled 0 parts of cut units and 1 "):
        unitsplit.confirm(RULE, (("SPLIT", "1"),), built("long_1.o", "short.o"))  # the patch did not cut
    assert "no unit it cuts was compiled" in unitsplit.confirm(RULE, (("SPLIT", "1"),), built("short.o"))  # cache hits
    with pytest.raises(BuildError, match="the plan said SPLIT=0"):
        unitsplit.confirm(RULE, (("SPLIT", "0"),), cut)
    assert unitsplit.confirm(None, (), cut) == "" and unitsplit.confirm(RULE, (("SPLIT", "1"),), []) == ""
