"""The wheel naming rule: builds that differ in archs, CUDA or torch never share a file name."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from kforge.config.forge import load_forge
from kforge.config.wheelname import arch_label, is_release_set, local_version_label
from kforge.cuda.arch import parse_arch_list

ROOT = Path(__file__).resolve().parents[2]
CUDA = Version("13.0")
TORCH = Version("2.11.0")


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


def test_arch_label_is_sorted_and_keeps_variants() -> None:
    assert arch_label(parse_arch_list("120a;80;90+PTX")) == "sm80.sm90.sm120a"


@pytest.mark.parametrize(
    ("project", "archs", "label"),
    [
        ("fmha", "90a", "sm90a"),
        ("fmha", "80", "sm80"),
        ("fmha", "80;86;89;90a;100a;120a", None),  # the release set: the plain version
        ("fmha", "120a;100a;90a;89;86;80", None),  # in any order
        ("flash-attn", "80;90;100;120", "cu130torch2.11"),
        ("flash-attn", "80;120", "cu130torch2.11.sm80.sm120"),
        ("flash-attn3", "90a", "cu130torch2.11.sm90a"),  # no release set declared: always labelled
    ],
)
def test_local_version_label(forge, project, archs, label) -> None:
    assert local_version_label(forge.projects[project], parse_arch_list(archs), CUDA, TORCH) == label


def test_label_is_a_valid_local_version(forge) -> None:
    label = local_version_label(forge.projects["flashmla"], parse_arch_list("100f;120a"), CUDA, TORCH)
    assert str(Version(f"1.0.0+{label}")) == "1.0.0+cu130torch2.11.sm100f.sm120a"


def test_torch_abi_label_without_torch(forge) -> None:
    assert local_version_label(forge.projects["flash-attn"], parse_arch_list("80"), CUDA, None) == "cu130.sm80"


def test_release_set(forge) -> None:
    assert is_release_set(forge.projects["flashmla"], parse_arch_list("sm_100f;sm_90a"))
    assert not is_release_set(forge.projects["flashmla"], parse_arch_list("sm_90a"))
    assert not is_release_set(forge.projects["flash-attn3"], parse_arch_list("sm_90a"))
