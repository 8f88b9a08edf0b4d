"""kforge.sources.audit: env reads found in a fixture upstream (the shapes the real ones use), and the CLI."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from kforge.cli import main
from kforge.config.forge import load_forge
from kforge.sources import audit

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "audit"
DEMO = FIXTURE / "upstream_demo"


@pytest.fixture(scope="module")
def project():
    fmha = load_forge(ROOT).projects["fmha"]  # a real Project, re-pointed at the fixture's knobs
    return dataclasses.replace(
        fmha, name="demo", env={"DEMO_FORCE_BUILD": "TRUE", "DEMO_NOT_READ": "1"}, profiles={},
        arch_knobs=(), threads_env="DEMO_NVCC_THREADS", local_version_env="DEMO_LOCAL_VERSION",
        upstream_version="1.2.0", build_dir=".", torch_abi=True,
    )


def test_python_reads_of_every_shape() -> None:
    reads = audit.python_env_reads((DEMO / "setup.py").read_text(), "setup.py")
    names = {r.name for r in reads}
    # os.environ.get, os.environ[...], "X" in os.environ, and a helper that passes its argument to os.getenv
    assert {"DEMO_FORCE_BUILD", "DEMO_HOME", "DEMO_HOME_SET", "DEMO_DISABLE_SM90"} <= names
    assert "flag" not in names  # the helper's own parameter is not a variable name
    site = next(r.site for r in reads if r.name == "DEMO_DISABLE_SM90")
    assert site.line == 14 and "is_flag_set" in site.text


def test_a_name_bound_to_a_constant_is_followed() -> None:
    reads = audit.python_env_reads((DEMO / "pkg" / "knobs.py").read_text(), "pkg/knobs.py")
    assert [r.name for r in reads] == ["DEMO_NVCC_THREADS"]


def test_cmake_env_and_arch_flags() -> None:
    text = (DEMO / "CMakeLists.txt").read_text()
    assert [r.name for r in audit.cmake_env_reads(text, "CMakeLists.txt")] == ["DEMO_CMAKE_ARCHS"]
    assert [s.line for s in audit.hard_coded_arch_flags(text, "CMakeLists.txt")] == [2]


def test_build_scripts_skip_tests_and_follow_imports() -> None:
    names = ["setup.py", "pkg/knobs.py", "tests/demo_helpers.py", "docs/conf.py", "hopper/setup.py", "other/x.py",
             "pkg/test_x.py", "README.md"]
    assert audit.build_scripts(names) == ("setup.py", "pkg/knobs.py", "hopper/setup.py", "other/x.py")
    # a build dir: its files, plus the top-level packages its scripts import
    assert audit.build_scripts(names, "hopper", {"pkg"}) == ("pkg/knobs.py", "hopper/setup.py")


def test_audit_of_the_fixture(project) -> None:
    patch = (FIXTURE / "demo.patch").read_text()
    report = audit.audit(project, audit.dir_tree(DEMO), patches=[("0001-demo.patch", patch)])
    by_name = {k.name: k for k in report.knobs}
    assert by_name["DEMO_FORCE_BUILD"].status == "read by upstream"
    assert [str(s) for s in by_name["DEMO_NVCC_THREADS"].upstream] == ["pkg/knobs.py:6"]
    assert by_name["DEMO_LOCAL_VERSION"].status == "read through our patch 0001-demo.patch"
    assert by_name["MAX_JOBS"].status.startswith("read by torch.utils.cpp_extension")
    assert by_name["DEMO_NOT_READ"].dead and not report.ok
    assert by_name["NVCC_THREADS"].status.startswith("not read here") and not by_name["NVCC_THREADS"].dead
    ignored = dict(report.ignored)
    assert {"DEMO_HOME", "DEMO_HOME_SET", "DEMO_DISABLE_SM90", "DEMO_CMAKE_ARCHS"} <= set(ignored)
    assert "DEMO_TEST_ONLY" not in ignored  # tests/ holds no build logic
    assert {(s.file, s.line) for s in report.arch_flags} == {("setup.py", 15), ("CMakeLists.txt", 2)}
    assert report.version_found is not None and report.version_found[0] == "1.2.0" and not report.version_mismatch


def test_torch_readers_only_count_for_torch_extensions(project) -> None:
    cmake_project = dataclasses.replace(project, torch_abi=False)
    by_name = {k.name: k for k in audit.audit(cmake_project, audit.dir_tree(DEMO)).knobs}
    assert by_name["MAX_JOBS"].status == "not read here (kforge sets it for every project)"
    assert by_name["CPLUS_INCLUDE_PATH"].status == "read by g++ (the host compiler)"


def test_cmake_args_of_a_profile_count_as_read_by_the_cmake_front_ends(project) -> None:
    """flash-attn3-standalone's profiles pass FA3S_PROFILE as CMAKE_ARGS: no upstream script reads it, CMake's
    front ends do (scikit-build-core, kforge's cmake backend)."""
    profiled = dataclasses.replace(project, env={"DEMO_FORCE_BUILD": "TRUE", "CMAKE_ARGS": "-DFA3S_PROFILE=minimal"})
    knob = {k.name: k for k in audit.audit(profiled, audit.dir_tree(DEMO)).knobs}["CMAKE_ARGS"]
    assert knob.status.startswith("read by scikit-build-core") and not knob.dead


def test_version_mismatch_is_a_problem(project) -> None:
    bumped = dataclasses.replace(project, env={"DEMO_FORCE_BUILD": "TRUE"}, upstream_version="1.3.0")
    report = audit.audit(bumped, audit.dir_tree(DEMO), patches=[("p", (FIXTURE / "demo.patch").read_text())])
    assert not report.dead_knobs and report.version_mismatch and not report.ok


def test_git_tree_reads_a_commit_not_the_worktree(tmp_path: Path, project) -> None:
    repo = tmp_path / "up"
    subprocess.run(["cp", "-r", str(DEMO), str(repo)], check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (repo / "setup.py").write_text("import os\nos.getenv('ONLY_IN_WORKTREE')\n")
    tree = audit.git_tree(repo, "HEAD")
    report = audit.audit(project, tree)
    assert "ONLY_IN_WORKTREE" not in dict(report.ignored) and "DEMO_HOME" in dict(report.ignored)
    with pytest.raises(audit.SourceError, match="is not a commit"):
        audit.git_tree(repo, "0" * 40)


def test_cli_audit_on_a_tree(capsys) -> None:
    code = main(["-C", str(ROOT), "audit", "flashmla", "--tree", str(DEMO)])
    out = capsys.readouterr().out
    # FlashMLA's knobs are not in the demo tree: the audit says so and fails
    assert code == 1 and "FLASH_MLA_DISABLE_SM90" in out and "NOT READ" in out
    assert "PROBLEMS" in out


def test_cli_audit_bad_repo_is_a_clear_error(tmp_path: Path, capsys) -> None:
    code = main(["-C", str(ROOT), "audit", "flashmla", "--repo", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 5 and "is not a git repository" in err and "Traceback" not in err
