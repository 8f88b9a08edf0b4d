"""kforge.commands._common: the plan a command makes and the host facts later steps judge are the same."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from packaging.version import Version

from kforge import preflight
from kforge.build.host import HostFacts
from kforge.commands import _common

ROOT = Path(__file__).resolve().parents[2]


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _common.add_plan_options(parser)
    args = parser.parse_args([])
    args.root = str(ROOT)
    return args


def test_a_torch_abi_build_hands_preflight_the_host_with_the_plans_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bug this guards: the plan probed torch ("present: torch 2.11.0 in this interpreter") but the build
    # passed the unprobed host to preflight, which then said "this interpreter has no torch" (GPU host, 2026-11-23).
    probed: list[str] = []

    def fake_with_torch(facts: HostFacts, python: str) -> HostFacts:
        probed.append(python)
        return facts.with_(torch_version=Version("2.11.0"))

    monkeypatch.setattr(_common, "with_torch", fake_with_torch)
    bare = _common.detect_host({"PATH": "/usr/bin:/bin"})
    assert bare.torch_version is None
    plan, host = _common.plan_and_host(_args(), "flashmla-sm90", environ={"PATH": "/usr/bin:/bin"}, host=bare)
    assert probed and host.torch_version == Version("2.11.0")
    assert plan.provisioning is None or not plan.provisioning.env_needed  # torch is this interpreter's
    preflight.check_toolchain(plan, host, {"PATH": "/usr/bin:/bin"})  # no "has no torch" error
    with pytest.raises(Exception, match="has no torch"):
        preflight.check_toolchain(plan, bare, {"PATH": "/usr/bin:/bin"})


def test_a_torch_free_build_never_probes_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "with_torch", lambda facts, python: pytest.fail("probed torch for fmha"))
    bare = _common.detect_host({"PATH": "/usr/bin:/bin"})
    plan, host = _common.plan_and_host(_args(), "fmha-sm90", environ={"PATH": "/usr/bin:/bin"}, host=bare)
    assert host is bare and plan.project.name == "fmha"


def test_the_plan_reads_the_job_profile_of_the_build_profile_it_builds(tmp_path: Path) -> None:
    """A minimal build's measured units size later minimal builds, never a full one (FA3's units differ)."""
    from kforge.build import profiles
    from kforge.build.measure import UnitMeasure

    profiles.record(tmp_path, "flash-attn3-standalone", 1, [UnitMeasure("u.o", 100.0, 2 * 2**30)], build_profile="minimal")
    environ = {"PATH": "/usr/bin:/bin", "KFORGE_CACHE": str(tmp_path)}
    bare = _common.detect_host(environ)
    args = _args()
    args.profile = "minimal"
    minimal, _ = _common.plan_and_host(args, "flash-attn3-standalone-sm90", environ=environ, host=bare)
    assert "measured (1 builds)" in minimal.jobs.reason
    args.profile = None  # the default profile, full: nothing measured for it yet
    full, _ = _common.plan_and_host(args, "flash-attn3-standalone-sm90", environ=environ, host=bare)
    assert full.profile == "full" and "seed: FA3 fwd units" in full.jobs.reason
