"""Variants: the id rule, the wheel label, parsing, and the per-part provisioning decision."""

from __future__ import annotations

import pytest
from packaging.version import Version

from kforge.config.variant import Variant, parse_python, parse_variant_id, parse_version, provisioning, wheel_label
from kforge.errors import ConfigError


def test_id_rule_and_its_inverse():
    v = Variant(cuda=Version("13.0"), python="3.12", torch=Version("2.11.0"))
    assert v.id == "cu130-torch2.11-cp312"
    assert parse_variant_id(v.id) == Variant(cuda=Version("13.0"), python="3.12", torch=Version("2.11"))
    free = Variant(cuda=Version("12.8"), python="3.10")
    assert free.id == "cu128-cp310"
    assert parse_variant_id("cu128-cp310") == free
    assert v.cuda_tag == "cu130" and free.cuda_tag == "cu128"


def test_wheel_label_is_cuda_and_torch_and_none_without_torch():
    assert wheel_label(Variant(Version("13.0"), "3.12", Version("2.9.1"))) == "cu130torch2.9"
    assert wheel_label(Variant(Version("13.0"), "3.12")) is None


def test_abi_follows_torch():
    assert Variant(Version("13.0"), "3.12", Version("2.11.0")).cxx11_abi is True
    assert Variant(Version("12.4"), "3.10", Version("2.5.1")).cxx11_abi is False
    assert Variant(Version("13.0"), "3.12").cxx11_abi is None


def test_torch_requirement_pins_exactly_or_by_series():
    assert Variant(Version("13.0"), "3.12", Version("2.9.1")).torch_requirement == "torch==2.9.1"
    assert Variant(Version("13.0"), "3.12", Version("2.11")).torch_requirement == "torch==2.11.*"


@pytest.mark.parametrize("text,want", [("3.12", "3.12"), ("cp310", "3.10"), ("313", "3.13")])
def test_parse_python(text, want):
    assert parse_python(text, "--python") == want


@pytest.mark.parametrize("bad", ["2.7", "three", "3", "3.x"])
def test_bad_python_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="--python"):
        parse_python(bad, "--python")


@pytest.mark.parametrize("bad", ["two", "2", "2.11.0+cu130", "2.12.0rc1"])
def test_bad_torch_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="--torch"):
        parse_version(bad, "--torch", "torch")


def test_bad_variant_id():
    with pytest.raises(ConfigError, match="not a variant id"):
        parse_variant_id("cuda13-py3")


def _prov(variant, **kw):
    base = dict(torch_abi=True, build_isolation=False, host_python="3.12", host_torch=Version("2.11.0+cu130"),
                cuda_how="use the installed nvcc", cuda_present=True, build_requires=("ninja",))
    base.update(kw)
    return provisioning(variant, **base)


def test_host_has_everything_nothing_to_provision():
    p = _prov(Variant(Version("13.0"), "3.12", Version("2.11")))
    assert not p.env_needed and p.requirements == ()
    assert p.part("torch").present and p.part("torch").how.startswith("present: torch 2.11.0+cu130")
    assert p.part("python").how == "present: this interpreter"


def test_other_torch_and_python_are_provisioned_with_uv():
    p = _prov(Variant(Version("13.0"), "3.10", Version("2.9.1")))
    assert p.env_needed
    assert p.requirements == ("torch==2.9.1", "ninja")
    assert not p.part("python").present and "uv venv --python 3.10" in p.part("python").how
    assert not p.part("torch").present and "uv pip install torch==2.9.1" in p.part("torch").how
    assert p.part("cxx11_abi").want == "True"


def test_torch_free_project_needs_no_torch_and_an_isolated_build_installs_none():
    p = _prov(Variant(Version("13.0"), "3.12"), torch_abi=False, build_isolation=True)
    assert not p.env_needed and p.part("torch").how.startswith("not needed")
    # another Python: an environment, but torch-free, so no torch requirement
    q = _prov(Variant(Version("13.0"), "3.10"), torch_abi=False, build_isolation=True, build_requires=())
    assert q.env_needed and q.requirements == ()
