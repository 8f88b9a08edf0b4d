"""The PTX and debug-info policy of a build: forge.toml's ptx / upstream_ptx / strip_debug, the build options over
them, what the plan prints, and what the renderers get (kforge.config.binarypolicy)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kforge.config.binarypolicy import binary_policy
from kforge.config.forge import load_forge
from kforge.cuda.arch import parse_arch, parse_arch_list
from kforge.cuda.render import render_gencode

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


def test_upstream_resolves_to_what_upstreams_own_build_ships(forge) -> None:
    fa = binary_policy(forge.projects["flash-attn"])
    assert (fa.ptx, fa.ptx_from, fa.render_ptx, fa.strip_debug) == ("none", "upstream_ptx", False, True)
    assert fa.ptx_line(parse_arch_list("90")) == "none (upstream's: SASS only)"
    assert fa.debug_line().startswith("stripped (forge.toml strip_debug): strip --strip-debug before repair")
    assert render_gencode(parse_arch_list("90"), ptx=fa.render_ptx) == ("-gencode=arch=compute_90,code=sm_90",)


def test_without_a_recorded_upstream_ptx_the_plan_says_it_fell_back(forge) -> None:
    bare = replace(forge.projects["flash-attn"], upstream_ptx=None)
    policy = binary_policy(bare)
    assert (policy.ptx, policy.ptx_from, policy.render_ptx) == ("highest", "default", "last")
    assert "upstream's is not recorded (no upstream_ptx in forge.toml): kforge's default" in policy.ptx_line(
        parse_arch_list("90"))


def test_options_win_over_forge_toml_and_the_plan_names_them(forge) -> None:
    fa = forge.projects["flash-attn"]
    every = binary_policy(fa, ptx="all", strip_debug=False)
    assert (every.ptx, every.ptx_from, every.render_ptx, every.strip_debug) == ("all", "option", True, False)
    assert every.ptx_line(parse_arch_list("80;120")) == "all (--ptx / KFORGE_PTX; upstream's: SASS only)"
    assert every.debug_line() == "kept (--keep-debug / KFORGE_STRIP_DEBUG)"
    assert binary_policy(fa, ptx="upstream").ptx == "none"  # --ptx upstream reads upstream_ptx too
    own = binary_policy(forge.projects["fmha"])
    assert (own.ptx, own.ptx_from) == ("highest", "ptx")
    assert own.ptx_line([parse_arch("sm_80")]) == 'highest (forge.toml ptx = "highest")'


def test_arch_specific_ptx_is_called_what_it_is(forge) -> None:
    """compute_90a PTX JIT-compiles only on 9.0 GPUs, which run the sm_90a SASS: the plan says it adds no reach."""
    fmha = binary_policy(forge.projects["fmha"])
    line = fmha.ptx_line(parse_arch_list("80;90a"))
    assert line.endswith("; compute_90a PTX runs only where sm_90a SASS already does: it adds size, not reach")
    assert "adds size" not in fmha.ptx_line(parse_arch_list("90a;120f"))  # the family PTX runs on later 12.x too
    assert "adds size" not in binary_policy(forge.projects["flash-attn3"]).ptx_line(parse_arch_list("90a"))


@pytest.mark.parametrize(("platform_os", "backend", "why"), [
    ("windows", "native", "nothing to strip: a windows binary holds no DWARF .debug_* sections"),
    ("linux", "cmake", "the cmake backend packs the library as installed; it is never repaired"),
])
def test_stripping_applies_only_where_kforge_repairs_a_linux_wheel(forge, platform_os, backend, why) -> None:
    policy = binary_policy(forge.projects["fmha"], platform_os=platform_os, backend=backend)
    assert not policy.strip_debug and policy.debug_line() == f"kept ({why})"
    assert binary_policy(forge.projects["fmha"], backend="cibuildwheel").strip_debug  # kforge repair in the container


def test_to_dict_carries_every_field(forge) -> None:
    assert binary_policy(forge.projects["flashinfer"]).to_dict() == {
        "ptx": "none", "ptx_from": "upstream_ptx", "upstream_ptx": "none", "strip_debug": True,
        "strip_from": "forge.toml strip_debug"}
