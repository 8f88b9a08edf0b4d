"""kforge.config.profilearchs: a build profile that switches off kernels the target's archs need is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.config.forge import load_forge
from kforge.config.profilearchs import profile_conflict
from kforge.config.targets import parse_target
from kforge.verified.matrix import build_rows

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


def archs(forge, text):
    return parse_target(forge, text, "linux-x86_64").archs


def test_the_port_profile_clashes_with_sm100_and_names_the_variable(forge) -> None:
    mla = forge.projects["flashmla"]
    why = profile_conflict(mla, "sm120-port", archs(forge, "flashmla-release"))
    assert why is not None
    assert "FLASH_MLA_DISABLE_SM100=1" in why and "sm_100f" in why and "sm120-port" in why


@pytest.mark.parametrize("target", ["flashmla-sm90", "flashmla-sm120"])
def test_the_port_profile_fits_targets_without_sm100(forge, target) -> None:
    assert profile_conflict(forge.projects["flashmla"], "sm120-port", archs(forge, target)) is None


def test_no_profile_and_the_default_profile_never_clash(forge) -> None:
    mla = forge.projects["flashmla"]
    assert profile_conflict(mla, None, archs(forge, "flashmla-release")) is None
    assert profile_conflict(mla, "full", archs(forge, "flashmla-sm100+sm120")) is None


def test_the_matrix_marks_the_clashing_cells(forge) -> None:
    rows = {(r.target.id, r.profile): r for r in build_rows(forge, (), "linux-x86_64")}
    clash = rows[("flashmla-release", "sm120-port")]
    assert clash.status == "unbuildable" and "FLASH_MLA_DISABLE_SM100" in clash.reason
    assert rows[("flashmla-release", "full")].status == "planned"
