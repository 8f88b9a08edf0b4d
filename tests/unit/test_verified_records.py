"""docs/verified/records.toml: the records of real runs, read against forge.toml; every mistake names the run."""

from __future__ import annotations

import sys
from pathlib import Path

import kforge_testkit
import pytest

from kforge.config.forge import load_forge
from kforge.errors import ConfigError, TargetError
from kforge.verified.records import RECORDS_FILE, load_runs, parse_runs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

PROJECTS = """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a"]
platforms = ["linux-x86_64", "windows-amd64"]
[projects.demo.profiles.full]
env = {}
[projects.demo.profiles.small]
env = { DEMO_SMALL = "1" }

[projects.plain]
source = { local = "kernels/plain" }
archs = ["sm_90a"]
"""

GOOD = """
[[run]]
target = "demo-sm90"
via = "kforge"
status = "gpu-tested"
host = "nvidia-h200"
device = "NVIDIA H200"
date = "2026-11-27"
time = "02:34-02:40"
wheel_bytes = 123
tests = "5 passed"
section = "Run log, row demo"
"""


@pytest.fixture()
def forge(tmp_path: Path):
    kforge_testkit.write_forge_toml(tmp_path, PROJECTS, windows=True)
    return load_forge(tmp_path)


def runs_of(forge, text: str):
    return parse_runs(forge, tomllib.loads(text), forge.root / RECORDS_FILE)


def test_a_run_resolves_its_target_as_a_linux_x86_64_host_spells_it(forge) -> None:
    (run,) = runs_of(forge, GOOD)
    assert run.key == ("demo", ("sm_90a",), "linux-x86_64")
    assert (run.status, run.device, run.host, run.when, run.wheel_bytes) == (
        "gpu-tested",
        ("NVIDIA H200",),
        ("nvidia-h200",),
        "2026-11-27 02:34-02:40",
        123,
    )
    assert run.profile == "full"  # a kforge run without a profile used the project's default, as `kforge build` does
    (windows,) = runs_of(forge, GOOD.replace('"demo-sm90"', '"demo-sm80-windows"'))
    assert windows.key == ("demo", ("sm_80",), "windows-amd64")


def test_a_run_outside_kforge_without_a_profile_names_none(forge) -> None:
    (run,) = runs_of(forge, GOOD.replace('via = "kforge"', 'via = "cmake"'))
    assert run.profile is None and not run.through_kforge
    (small,) = runs_of(forge, GOOD.replace('via = "kforge"', 'via = "cmake"\nprofile = "small"'))
    assert small.profile == "small"


def test_an_unknown_target_names_the_run_and_says_what_to_do(forge) -> None:
    with pytest.raises(TargetError) as err:
        runs_of(forge, GOOD + GOOD.replace('"demo-sm90"', '"dmeo-sm90"'))
    text = err.value.render()
    assert "run[1]" in text and "'dmeo-sm90'" in text and "did you mean 'demo'" in text
    assert "kforge targets" in text and "kforge matrix --markdown" in text
    with pytest.raises(TargetError, match="does not support sm_100"):
        runs_of(forge, GOOD.replace('"demo-sm90"', '"demo-sm100"'))


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (('status = "gpu-tested"', 'status = "gpu-tsted"'), ["run[0].status", "did you mean 'gpu-tested'"]),
        (('via = "kforge"', 'via = "bazel"'), ["run[0].via", "kforge, cmake, setup.py, other"]),
        (('date = "2026-11-27"', 'date = "27.11.2026"'), ["run[0].date", "YYYY-MM-DD"]),
        (('date = "2026-11-27"', 'date = "2026-02-30"'), ["run[0].date"]),
        (('time = "02:34-02:40"', 'time = "about 2am"'), ["run[0].time", "HH:MM"]),
        (('device = "NVIDIA H200"\n', ""), ["run[0].device", "GPU its tests ran on"]),
        (('host = "nvidia-h200"', "host = []"), ["run[0].host"]),
        (("wheel_bytes = 123", 'wheel_bytes = "123"'), ["run[0].wheel_bytes", "integer"]),
        (("wheel_bytes = 123", "wheel_bytes = 0"), ["run[0].wheel_bytes"]),
        (('tests = "5 passed"', 'tests = "5 | passed"'), ["run[0].tests", "'|'"]),
        (('device = "NVIDIA H200"', 'device = ["NVIDIA H200", " "]'), ["run[0].device[1]", "one line"]),
        (('tests = "5 passed"', 'test = "5 passed"'), ["run[0].test", "did you mean 'tests'"]),
        (('via = "kforge"', 'via = "kforge"\nprofile = "smal"'), ["run[0].profile", "did you mean 'small'"]),
    ],
)
def test_a_mistake_in_a_run_is_a_config_error_naming_its_key(forge, change, needles) -> None:
    with pytest.raises(ConfigError) as err:
        runs_of(forge, GOOD.replace(*change))
    for needle in needles:
        assert needle in err.value.render()
    assert err.value.render().startswith("records.toml: ")


def test_a_profile_on_a_project_without_profiles_is_refused(forge) -> None:
    text = GOOD.replace('"demo-sm90"', '"plain-sm90"').replace('via = "kforge"', 'via = "kforge"\nprofile = "full"')
    with pytest.raises(ConfigError, match="plain has no build profiles"):
        runs_of(forge, text)
    (run,) = runs_of(forge, GOOD.replace('"demo-sm90"', '"plain-sm90"'))
    assert run.profile is None


def test_only_run_tables_are_allowed(forge) -> None:
    with pytest.raises(ConfigError, match="did you mean 'run'"):
        runs_of(forge, GOOD.replace("[[run]]", "[[runs]]"))


def test_a_missing_or_broken_records_file_is_one_paragraph(forge, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the records"):
        load_runs(forge)
    path = tmp_path / "records.toml"
    path.write_text("[[run]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_runs(forge, path)


def test_the_committed_records_read_and_each_gpu_tested_run_names_its_gpu() -> None:
    runs = load_runs(load_forge(ROOT))
    assert len(runs) >= 30
    assert all(r.device for r in runs if r.status == "gpu-tested")
    assert {r.via for r in runs} <= {"kforge", "cmake", "setup.py", "other"}
    # a kforge run of flash-attn3 or flashinfer names its profile (one the project declares), never leaves it to
    # a default it may not have used
    forge = load_forge(ROOT)
    assert all(
        r.profile is not None and r.profile in forge.projects[r.target.project].profiles
        for r in runs
        if r.through_kforge and r.target.project in ("flash-attn3", "flash-attn3-standalone", "flashinfer")
    )
