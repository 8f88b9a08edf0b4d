"""forge.toml's [ci] table and projects.*.unbuildable: defaults, the real file, and malformed input."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from kforge.config import forge as config
from kforge.config.forge import load_forge
from kforge.config.model import DEFAULT_CI_RUNNERS, CiSettings
from kforge.cuda.arch import parse_arch
from kforge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[platforms.linux-x86_64]
alias = "linux"
os = "linux"

[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a"]
arch_knobs = [{ env = "DEMO_ARCHS", format = "cmake" }]
"""


def load(tmp_path: Path, extra: str):
    (tmp_path / "forge.toml").write_text(MINIMAL + extra)
    return load_forge(tmp_path)


def test_defaults_without_a_ci_table(tmp_path: Path) -> None:
    forge = load(tmp_path, "")
    assert forge.ci == CiSettings()
    assert forge.ci.runners["linux-x86_64"] == DEFAULT_CI_RUNNERS["linux-x86_64"]
    assert forge.projects["demo"].unbuildable == {}


def test_the_real_file() -> None:
    forge = load_forge(ROOT)
    assert forge.ci.gpu_labels == ("self-hosted", "linux", "x64", "gpu")
    assert forge.ci.runners["linux-x86_64"].self_hosted == ("self-hosted", "linux", "x64", "build")
    assert forge.ci.runners["windows-amd64"].hosted_cuda == "action"
    mla = forge.projects["flashmla"]  # sm_120a builds since our port (patches/flashmla 0011-0013)
    assert mla.unbuildable == {} and mla.unbuildable_reason(parse_arch("sm_120a")) is None


def test_settings_are_read(tmp_path: Path) -> None:
    forge = load(tmp_path, """
[projects.demo.unbuildable]
sm_90a = "needs a port"

[ci]
publish = "release"
gpu_labels = ["self-hosted", "linux", "x64", "h100"]
test_timeout = 15

[ci.runners.linux-x86_64]
self_hosted = ["self-hosted", "linux", "x64", "big"]
""")
    assert forge.ci.publish == "release" and forge.ci.test_timeout == 15 and forge.ci.build_timeout == 360
    assert forge.ci.gpu_labels[-1] == "h100"
    runners = forge.ci.runners["linux-x86_64"]
    assert runners.self_hosted[-1] == "big" and runners.hosted == "ubuntu-24.04"  # the rest keeps its default
    demo = forge.projects["demo"]
    assert demo.unbuildable == {"sm_90": "needs a port"}
    assert demo.unbuildable_reason(parse_arch("sm_90a")) == demo.unbuildable_reason(parse_arch("sm_90")) == "needs a port"


@pytest.mark.parametrize("extra, words", [
    ('[ci]\npublish = "page"\n', ["ci.publish", "did you mean 'pages'"]),
    ('[ci]\nbuild_timeout = 0\n', ["ci.build_timeout", "positive"]),
    ('[ci]\ngpu_label = ["gpu"]\n', ["ci.gpu_label", "did you mean 'gpu_labels'"]),
    ('[ci]\ngpu_labels = []\n', ["ci.gpu_labels", "runner labels"]),
    ('[ci.runners.linux-x86]\nhosted = "x"\n', ["ci.runners.linux-x86", "did you mean 'linux-x86_64'"]),
    ('[ci.runners.linux-x86_64]\nhosted_cuda = "conda"\n', ["hosted_cuda", "pypi, action"]),
    ('[projects.demo.unbuildable]\nsm_120a = "x"\n', ["projects.demo.unbuildable.sm_120a", "not in archs"]),
    ('[projects.demo.unbuildable]\nsm_90a = ""\n', ["projects.demo.unbuildable.sm_90a", "reason"]),
])
def test_malformed(tmp_path: Path, extra: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra)
    for word in words:
        assert word in str(err.value)


def test_docs_list_every_ci_key() -> None:
    page = (ROOT / "docs" / "forge-toml.md").read_text()
    words = {w for span in re.findall(r"`([^`]+)`", page) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}
    missing = [f"{cls.__name__}.{f.name}" for cls in (config.CiTable, config.CiRunnersTable)
               for f in dataclasses.fields(cls) if f.name not in words]
    assert missing == []
