"""Target ids and the matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.config.forge import load_forge
from kforge.config.targets import expand_matrix, parse_target
from kforge.cuda.arch import parse_arch
from kforge.errors import ArchError, TargetError

ROOT = Path(__file__).resolve().parents[2]
HOST = "linux-x86_64"


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


@pytest.mark.parametrize(
    ("text", "project", "arch", "platform", "canonical"),
    [
        ("flashmla-sm120", "flashmla", "sm_120a", "linux-x86_64", "flashmla-sm120"),
        ("flashmla-sm_120a", "flashmla", "sm_120a", "linux-x86_64", "flashmla-sm120"),  # the declared variant: one id
        ("fmha-compute_90a", "fmha", "sm_90a", "linux-x86_64", "fmha-sm90"),
        ("flash-attn-sm120-windows", "flash-attn", "sm_120", "windows-amd64", "flash-attn-sm120-windows"),
        ("flash-attn-sm120-windows-amd64", "flash-attn", "sm_120", "windows-amd64", "flash-attn-sm120-windows"),
        ("flash-attn3-sm90", "flash-attn3", "sm_90a", "linux-x86_64", "flash-attn3-sm90"),
        ("flash-attn-9.0", "flash-attn", "sm_90", "linux-x86_64", "flash-attn-sm90"),
        ("flashinfer-sm120f", "flashinfer", "sm_120f", "linux-x86_64", "flashinfer-sm120f"),
        ("fmha-sm90-linux", "fmha", "sm_90a", "linux-x86_64", "fmha-sm90"),
        ("fmha-sm90-linux-arm", "fmha", "sm_90a", "linux-aarch64", "fmha-sm90-linux-arm"),
    ],
)
def test_parse_target(forge, text, project, arch, platform, canonical) -> None:
    t = parse_target(forge, text, HOST)
    assert (t.project, t.arch.sm, t.platform, t.id) == (project, arch, platform, canonical)


def test_no_arch_means_host_gpu_else_default(forge) -> None:
    assert parse_target(forge, "fmha", HOST).arch.sm == "sm_90a"
    assert parse_target(forge, "fmha", HOST, gpu_arch=parse_arch("sm_86")).arch.sm == "sm_86"
    with pytest.raises(ArchError, match="GPU is sm_75"):
        parse_target(forge, "fmha", HOST, gpu_arch=parse_arch("sm_75"))


def test_host_platform_moves_the_suffix(forge) -> None:
    t = parse_target(forge, "flash-attn-sm120", "windows-amd64")
    assert t.platform == "windows-amd64" and t.id == "flash-attn-sm120"
    assert parse_target(forge, "flash-attn-sm120-linux", "windows-amd64").id == "flash-attn-sm120-linux"


@pytest.mark.parametrize(
    ("text", "error", "needle"),
    [
        ("flashmal-sm90", TargetError, "did you mean 'flashmla'"),
        ("flashmla-sm80", ArchError, "flashmla does not support sm_80"),
        ("fmha-sm91", ArchError, "not a CUDA arch"),
        ("flashmla-sm90-macos", TargetError, "unknown platform 'macos'"),
        ("flash-attn3-sm90-windows", TargetError, "not built for windows-amd64"),
        ("flashmla-sm90-windows", TargetError, "excluded"),
        ("flashmla-sm90f", ArchError, "has no 'f' variant"),
        ("flashmla-sm100a", ArchError, "builds sm_100 as sm_100f"),
        ("", TargetError, "not a target id"),
    ],
)
def test_bad_targets(forge, text, error, needle) -> None:
    with pytest.raises(error) as info:
        parse_target(forge, text, HOST)
    assert needle in str(info.value)


def test_matrix_has_the_sessions_the_readme_promises(forge) -> None:
    ids = {t.id for t in expand_matrix(forge, HOST)}
    for wanted in ("flashmla-sm120", "flashmla-sm100", "flash-attn-sm90", "flash-attn-sm120-windows",
                   "flash-attn3-sm90", "flashinfer-sm120", "fmha-sm90"):
        assert wanted in ids
    assert "flashmla-sm90-windows" not in ids  # excluded by [matrix]
    assert "flashmla-sm120-windows" in ids
    assert not any(t.endswith("-linux-arm") and "-sm80" in t for t in ids)
    assert len(ids) == len(expand_matrix(forge, HOST))  # ids are unique


# ------------------------------------------------------------------ multi-arch targets and arch sets


@pytest.mark.parametrize(
    ("text", "archs", "platform", "canonical"),
    [
        ("flash-attn-sm80+sm120-windows", ["sm_80", "sm_120"], "windows-amd64", "flash-attn-sm80+sm120-windows"),
        ("flash-attn-sm120+sm80-windows", ["sm_80", "sm_120"], "windows-amd64", "flash-attn-sm80+sm120-windows"),  # one id
        ("flashmla-sm100+sm120", ["sm_100f", "sm_120a"], "linux-x86_64", "flashmla-sm100+sm120"),
        ("flashinfer-sm90+sm120f", ["sm_90", "sm_120f"], "linux-x86_64", "flashinfer-sm90+sm120f"),
        ("flash-attn-release", ["sm_80", "sm_90", "sm_100", "sm_120"], "linux-x86_64", "flash-attn-release"),
        ("fmha-release-windows", ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"], "windows-amd64",
         "fmha-release-windows"),
    ],
)
def test_multi_arch_targets(forge, text, archs, platform, canonical) -> None:
    t = parse_target(forge, text, HOST)
    assert ([a.sm for a in t.archs], t.platform, t.id) == (archs, platform, canonical)
    assert parse_target(forge, t.id, HOST) == t  # the id parses back to the same target


def test_a_multi_arch_target_has_no_single_arch(forge) -> None:
    t = parse_target(forge, "flashmla-sm100+sm120", HOST)
    assert t.arch_names == "sm_100f sm_120a"
    with pytest.raises(TargetError, match="builds 2 archs"):
        t.arch  # noqa: B018


@pytest.mark.parametrize(
    ("text", "error", "needle"),
    [
        ("fmha-sm90+sm90a", TargetError, "names sm_90 twice"),
        ("fmha-sm80+sm91", ArchError, "'sm91' in target"),
        ("flashmla-sm90+sm80", ArchError, "flashmla does not support sm_80"),
        ("flash-attn-sm80+sm100-windows", TargetError, "flash-attn sm_100 on windows-amd64 is excluded"),
        ("flash-attn-relase", ArchError, "did you mean 'release'"),
        ("flash-attn-release-windows", TargetError, "excluded"),  # sm_100 of the set is excluded on Windows
    ],
)
def test_bad_multi_arch_targets(forge, text, error, needle) -> None:
    with pytest.raises(error) as info:
        parse_target(forge, text, HOST)
    assert needle in str(info.value)


def test_matrix_lists_the_arch_sets_after_the_single_archs(forge) -> None:
    targets = expand_matrix(forge, HOST)
    ids = [t.id for t in targets]
    assert {"fmha-release", "flash-attn-release", "flashmla-release", "fmha-release-windows"} <= set(ids)
    assert "flash-attn-release-windows" not in ids  # its sm_100 is excluded on Windows
    assert ids.index("fmha-release") > ids.index("fmha-sm120")
    assert all(parse_target(forge, i, HOST).id == i for i in ids)
