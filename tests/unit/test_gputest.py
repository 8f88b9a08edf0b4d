"""kforge.gputest: the test tree is the patched tree the wheel was built from, and pytest sees the build's knobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from packaging.version import Version

from kforge.build.host import HostFacts, Resources
from kforge.build.profiles import load_profile
from kforge.config.forge import load_forge
from kforge.config.targets import parse_target
from kforge.gputest import GpuTestOutcome, PytestCounts, prepare_test_tree, pytest_environment, read_junit
from kforge.plan import PlanOptions, make_plan

FORGE = """
[platforms.linux-x86_64]
alias = "linux"
os = "linux"

[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_90"]
arch_knobs = [{ env = "DEMO_ARCHS", format = "numbers" }]
env = { DEMO_DISABLE_HDIM64 = "TRUE" }
patches = "patches/demo"
gpu_tests = { paths = ["tests/test_smoke.py"] }
"""

PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: kforge <kforge@users.noreply.invalid>
Subject: [PATCH] tests: a smoke file

---
diff --git a/tests/test_smoke.py b/tests/test_smoke.py
new file mode 100644
--- /dev/null
+++ b/tests/test_smoke.py
@@ -0,0 +1 @@
+def test_smoke(): pass
"""


def _plan(root: Path):
    forge = load_forge(root)
    host = HostFacts(platform="linux-x86_64", python="3.12", resources=Resources(4, 8 << 30, 16 << 30),
                     cuda_version=Version("13.0.88"), nvcc_path="/cuda/bin/nvcc", cuda_home="/cuda")
    target = parse_target(forge, "demo-sm90", host.platform)
    return forge, make_plan(forge, target, host, PlanOptions(), job_profile=load_profile(root / "cache", "demo", 1))


def test_tests_run_on_the_patched_tree_with_the_builds_env(tmp_path: Path) -> None:
    (tmp_path / "forge.toml").write_text(FORGE)
    (tmp_path / "kernels" / "demo" / "tests").mkdir(parents=True)
    (tmp_path / "kernels" / "demo" / "setup.py").write_text("")
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "0001-smoke.patch").write_text(PATCH)
    (tmp_path / "patches" / "demo" / "series").write_text("0001-smoke.patch\n")
    _forge, plan = _plan(tmp_path)

    tree, applied = prepare_test_tree(plan, tmp_path / ".kforge" / "work" / "t", cache_dir=tmp_path / "cache")
    assert applied == ("0001-smoke.patch",)
    assert (tree / "tests" / "test_smoke.py").read_text() == "def test_smoke(): pass\n"
    assert not (tmp_path / "kernels" / "demo" / "tests" / "test_smoke.py").exists()  # the source stays pristine

    env = pytest_environment({"PATH": "/bin", "DEMO_DISABLE_HDIM64": "FALSE"}, plan)
    assert env["PATH"] == "/bin"
    assert env["DEMO_DISABLE_HDIM64"] == "TRUE"  # the build's value wins: the tests must match the wheel
    assert env["DEMO_ARCHS"] == "90"


def test_read_junit_counts_what_pytest_reported(tmp_path: Path) -> None:
    """The counts come from a real pytest run's --junitxml report (what run_gpu_tests asks pytest to write)."""
    (tmp_path / "test_mix.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_ok_too(): pass\n"
        "def test_bad(): assert False\n"
        "@pytest.mark.skip(reason='no')\n"
        "def test_skipped(): pass\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('fixture')\n"
        "def test_error(broken): pass\n")
    report = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_mix.py"),
                           f"--junitxml={report}"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout
    assert read_junit(report) == PytestCounts(passed=2, failed=1, errors=1, skipped=1)
    assert read_junit(tmp_path / "missing.xml") is None
    (tmp_path / "torn.xml").write_text("<testsuites><testsuite tests=")
    assert read_junit(tmp_path / "torn.xml") is None


def test_outcome_dict_has_counts_or_none() -> None:
    assert GpuTestOutcome("skipped", "no GPU").to_dict() == {
        "status": "skipped", "reason": "no GPU", "passed": None, "failed": None, "errors": None, "skipped": None}
    assert GpuTestOutcome("passed", "", counts=PytestCounts(passed=8)).to_dict()["passed"] == 8


def _all_skipped_run(tmp_path: Path, monkeypatch, environ: dict[str, str]):  # type: ignore[no-untyped-def]
    import types

    import kforge.gputest as gt

    (tmp_path / "forge.toml").write_text(FORGE)
    (tmp_path / "kernels" / "demo").mkdir(parents=True)
    (tmp_path / "kernels" / "demo" / "setup.py").write_text("")
    _forge, plan = _plan(tmp_path)
    monkeypatch.setattr(gt, "gpu_problem", lambda host, wheel, inspect: None)
    monkeypatch.setattr(gt, "prepare_test_tree", lambda plan, dest, cache_dir: (dest, ()))

    def runner(cmd, env, *, cwd=None, capture=False):  # type: ignore[no-untyped-def]
        junit = next((a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml=")), None)
        if junit:  # pytest: every test skipped, exit 0 (what pytest does)
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            Path(junit).write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="3"/></testsuites>')
        return 0, ""

    published = types.SimpleNamespace(wheel=tmp_path / "demo-1.0-py3-none-any.whl")
    return gt.run_gpu_tests(plan, plan_host(), wheelhouse_root=tmp_path / "wh", environ=environ, runner=runner,
                            published=published)


def plan_host() -> HostFacts:
    return HostFacts(platform="linux-x86_64", python="3.12", resources=Resources(4, 8 << 30, 16 << 30))


def test_a_run_where_every_test_skipped_is_not_a_pass(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    outcome = _all_skipped_run(tmp_path, monkeypatch, {"PATH": "/usr/bin:/bin", "KFORGE_CACHE": str(tmp_path / "c")})
    assert outcome.status == "skipped" and "no test to a pass" in outcome.reason
    assert outcome.counts == PytestCounts(passed=0, skipped=3)


def test_every_test_skipped_fails_under_require_gpu(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from kforge.errors import GPUError

    with pytest.raises(GPUError, match="no test to a pass"):
        _all_skipped_run(tmp_path, monkeypatch, {"PATH": "/usr/bin:/bin", "KFORGE_CACHE": str(tmp_path / "c"),
                                                 "KFORGE_REQUIRE_GPU": "1"})
