"""The patch queue with real git and real files: status, atomic apply, idempotence, revert,
conditional entries, drift caught by ``check --rev``, refresh after a rebase, sdist trees."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_testkit  # noqa: E402
from kforge_gitfixtures import (  # noqa: E402
    TINY_PATCHES,
    UPSTREAM_TINY,
    commit_change,
    git,
    make_superproject,
    make_upstream,
    use_test_git_config,
    write_forge,
)

from kforge.errors import PatchError  # noqa: E402
from kforge.sources import patches  # noqa: E402
from kforge.sources import upstream as sources
from kforge.sources.patches import PatchState  # noqa: E402
from kforge.sources.series import PatchContext, load_series, series_hash  # noqa: E402

pytestmark = pytest.mark.integration

LINUX_90 = PatchContext("linux-x86_64", ("sm_90a",), "0.1.0")
WIN_120 = PatchContext("windows-amd64", ("sm_90a", "sm_120a"), "0.1.0")


@pytest.fixture()
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    use_test_git_config(monkeypatch, tmp_path / "home")
    repo = tmp_path / "upstream"
    return repo, make_upstream(repo)


@pytest.fixture()
def series():
    return load_series(TINY_PATCHES)


def export(repo: Path, dest: Path) -> Path:
    sources.export_checkout(repo, dest)
    return dest


def states(statuses) -> list[str]:
    return [str(s.state) for s in statuses]


def test_status_on_pristine_tree_with_conditions(upstream, series, tmp_path: Path) -> None:
    repo, _ = upstream
    tree = export(repo, tmp_path / "tree")
    before = sources.tree_hash(tree)
    assert states(patches.status(tree, series, LINUX_90)) == ["applies", "applies", "skipped", "skipped"]
    assert states(patches.status(tree, series, WIN_120)) == ["applies"] * 4
    skipped = patches.status(tree, series, LINUX_90)[2]
    assert "platform=windows" in skipped.message
    assert sources.tree_hash(tree) == before  # status never touches the tree


def test_apply_is_idempotent_and_revert_restores_bytes(upstream, series, tmp_path: Path) -> None:
    repo, _ = upstream
    tree = export(repo, tmp_path / "tree")
    pristine = sources.tree_hash(tree)

    first = patches.apply(tree, series, WIN_120)
    assert len(first.applied) == 4 and first.already == ()
    patched = sources.tree_hash(tree)
    assert patched != pristine
    assert "#define TINY_BLOCK 256" in (tree / "csrc" / "tiny.cu").read_text()
    assert "tiny_patched_for_sm120" in (tree / "csrc" / "tiny.cu").read_text()
    assert states(patches.status(tree, series, WIN_120)) == ["applied"] * 4

    second = patches.apply(tree, series, WIN_120)
    assert second.applied == () and len(second.already) == 4
    assert sources.tree_hash(tree) == patched  # not patched twice

    reverted = patches.revert(tree, series, WIN_120)
    assert len(reverted.applied) == 4
    assert sources.tree_hash(tree) == pristine
    assert patches.revert(tree, series, WIN_120).applied == ()  # nothing left to revert
    assert first.series_hash == series_hash(series, WIN_120)


def test_partially_applied_tree_gets_the_rest(upstream, series, tmp_path: Path) -> None:
    repo, _ = upstream
    tree = export(repo, tmp_path / "tree")
    patches.apply(tree, series, LINUX_90)  # 0001, 0002
    result = patches.apply(tree, series, WIN_120)  # now also 0003, 0004
    assert result.already == ("0001-setup-build-sm_120-by-default.patch", "0002-tiny.cu-256-threads-per-block.patch")
    assert len(result.applied) == 2


def _five_patch_series(repo: Path, base: str, dest: Path) -> None:
    """Five patches, each on its own line of tiny.cu / setup.py, made with real git."""
    git(repo, "checkout", "-q", "-b", "ours", base)
    commit_change(repo, "setup.py", 'TINY_CUDA_ARCHS", "80;90"', 'TINY_CUDA_ARCHS", "80;90;120"', "p1 archs")
    commit_change(repo, "csrc/tiny.cu", "#define TINY_BLOCK 128", "#define TINY_BLOCK 256", "p2 block")
    commit_change(repo, "csrc/tiny.cu", "if (err != cudaSuccess) return err;", "if (err != cudaSuccess) { return err; }",
                  "p3 braces")
    commit_change(repo, "tiny_upstream/__init__.py", '__version__ = "0.1.0"', '__version__ = "0.1.0+kforge"', "p4 ver")
    commit_change(repo, "setup.py", 'version="0.1.0"', 'version="0.1.0+kforge"', "p5 setup version")
    patches.refresh(dest, repo, base, "ours")
    git(repo, "checkout", "-q", "main")


def test_mid_series_failure_rolls_back_byte_for_byte(upstream, tmp_path: Path) -> None:
    repo, base = upstream
    _five_patch_series(repo, base, tmp_path / "series5")
    five = load_series(tmp_path / "series5")
    assert len(five.entries) == 5
    # upstream moves a line that patch 3 needs as context
    commit_change(repo, "csrc/tiny.cu", "    cudaError_t err = cudaMalloc(&dev, n * sizeof(float));",
                  "    cudaError_t err = cudaMalloc((void**)&dev, n * sizeof(float));", "upstream: cast")
    tree = export(repo, tmp_path / "tree")
    before = sources.tree_hash(tree)
    with pytest.raises(PatchError) as err:
        patches.apply(tree, five, LINUX_90)
    msg = err.value.render().lower()
    assert "patch 3 of 5" in msg and "0003-p3-braces.patch" in msg
    assert "csrc/tiny.cu, hunk 1" in msg
    assert "restored" in msg
    assert sources.tree_hash(tree) == before  # patches 1 and 2 were undone too

    status = patches.status(tree, five, LINUX_90)
    assert states(status) == ["applies", "applies", "fails", "applies", "applies"]
    failure = status[2].failures[0]
    assert failure.file == "csrc/tiny.cu" and failure.hunk == 1
    assert any("cudaMalloc((void**)&dev" in line for line in failure.actual)
    assert any("cudaMalloc(&dev" in line for line in failure.expected)


def test_failure_in_new_file_creation_removes_created_dirs(upstream, tmp_path: Path) -> None:
    repo, base = upstream
    git(repo, "checkout", "-q", "-b", "ours", base)
    (repo / "newdir" / "sub").mkdir(parents=True)
    (repo / "newdir" / "sub" / "added.txt").write_text("ours\n")
    git(repo, "add", "newdir")
    git(repo, "commit", "-q", "-m", "add a file")
    commit_change(repo, "setup.py", 'version="0.1.0"', 'version="0.1.0+kforge"', "bump")
    patches.refresh(tmp_path / "s", repo, base, "ours")
    git(repo, "checkout", "-q", "main")
    commit_change(repo, "setup.py", 'version="0.1.0"', 'version="0.2.0"', "upstream bump")
    tree = export(repo, tmp_path / "tree")
    before = sources.tree_hash(tree)
    with pytest.raises(PatchError, match="(?i)patch 2 of 2"):
        patches.apply(tree, load_series(tmp_path / "s"), LINUX_90)
    assert not (tree / "newdir").exists()
    assert sources.tree_hash(tree) == before


def test_check_rev_reports_drift_without_touching_checkout(upstream, series, tmp_path: Path) -> None:
    repo, base = upstream
    root = tmp_path / "mono"
    make_superproject(root, repo)
    drift = commit_change(repo, "csrc/tiny.cu", "#ifndef TINY_BLOCK", "#if !defined(TINY_BLOCK)", "upstream: style")
    sub = root / "externals" / "tiny"
    head_before, hash_before = git(sub, "rev-parse", "HEAD"), sources.tree_hash(sub)

    ok = patches.check_rev(sub, base, series, WIN_120)
    assert ok.ok and states(ok.statuses) == ["applies"] * 4

    report = patches.check_rev(sub, drift, series, WIN_120)  # fetched from origin on demand
    assert not report.ok
    by_name = {s.name: s for s in report.statuses}
    bad = by_name["0002-tiny.cu-256-threads-per-block.patch"]
    assert bad.state is PatchState.FAILS
    assert [(f.file, f.hunk) for f in bad.failures] == [("csrc/tiny.cu", 1)]
    assert "#if !defined(TINY_BLOCK)" in bad.failures[0].actual
    assert "#ifndef TINY_BLOCK" in bad.failures[0].expected
    assert by_name["0001-setup-build-sm_120-by-default.patch"].state is PatchState.APPLIES
    assert "upstream has there" in patches.hunk_report(bad.failures[0])

    assert git(sub, "rev-parse", "HEAD") == head_before
    assert sources.tree_hash(sub) == hash_before
    assert git(sub, "status", "--porcelain") == ""


def test_refresh_after_rebase_keeps_conditions(upstream, series, tmp_path: Path) -> None:
    repo, base = upstream
    out = tmp_path / "patches" / "tiny"
    shutil.copytree(TINY_PATCHES, out)
    # the working branch: our series as commits on the old pin (one commit per patch)
    git(repo, "checkout", "-q", "-b", "work", base)
    for entry in load_series(out).entries:
        git(repo, "am", "-q", str(entry.path))
    # upstream moves on, touching the context of patch 0002; the user rebases and resolves
    git(repo, "checkout", "-q", "main")
    new_pin = commit_change(repo, "csrc/tiny.cu", "#ifndef TINY_BLOCK", "#if !defined(TINY_BLOCK)", "upstream style")
    assert not patches.check_rev(repo, new_pin, load_series(out), WIN_120).ok
    git(repo, "checkout", "-q", "work")
    rebase = subprocess.run(["git", "rebase", "-q", "main"], cwd=repo, capture_output=True, text=True)
    assert rebase.returncode != 0 and "CONFLICT" in (rebase.stdout + rebase.stderr)
    resolved = git(repo, "show", f"{new_pin}:csrc/tiny.cu").replace("#define TINY_BLOCK 128", "#define TINY_BLOCK 256")
    (repo / "csrc" / "tiny.cu").write_text(resolved + "\n")
    git(repo, "add", "csrc/tiny.cu")
    subprocess.run(["git", "-c", "core.editor=true", "rebase", "--continue"], cwd=repo, check=True,
                   capture_output=True)
    result = patches.refresh(out, repo, new_pin, "work")
    assert len(result.patches) == 4
    refreshed = load_series(out)
    conds = {e.name: e.condition_text for e in refreshed.entries}
    assert conds["0003-setup-no-fPIC-for-MSVC.patch"] == "platform=windows"
    assert conds["0004-tiny.cu-mark-sm_120-builds.patch"] == "arch>=sm_120"
    assert refreshed.header[0].startswith("# Patch series for the tiny_upstream fixture")
    assert patches.check_rev(repo, new_pin, refreshed, WIN_120).ok
    assert not list(out.parent.glob(".tiny-*"))  # no staging leftovers


def test_apply_to_sdist_tree_which_is_not_a_git_repo(series, tmp_path: Path, monkeypatch) -> None:
    use_test_git_config(monkeypatch, tmp_path / "home")
    tree = tmp_path / "sdist" / "tiny_upstream-0.1.0"
    shutil.copytree(UPSTREAM_TINY, tree)
    assert subprocess.run(["git", "rev-parse"], cwd=tree, capture_output=True).returncode != 0
    before = sources.tree_hash(tree)
    patches.apply(tree, series, LINUX_90)
    assert "#define TINY_BLOCK 256" in (tree / "csrc" / "tiny.cu").read_text()
    patches.revert(tree, series, LINUX_90)
    assert sources.tree_hash(tree) == before


def test_apply_inside_an_enclosing_git_repo_patches_the_tree_itself(upstream, series, tmp_path: Path) -> None:
    repo, _ = upstream
    mono = tmp_path / "mono"
    mono.mkdir()
    git(mono, "init", "-q")
    tree = export(repo, mono / ".kforge" / "work" / "tiny" / "tiny")  # scratch trees live inside the monorepo
    patches.apply(tree, series, LINUX_90)
    assert "#define TINY_BLOCK 256" in (tree / "csrc" / "tiny.cu").read_text()


def test_cli_status_check_apply_revert(upstream, tmp_path: Path) -> None:
    repo, base = upstream
    root = tmp_path / "mono"
    make_superproject(root, repo)
    write_forge(root, repo, base)
    drift = commit_change(repo, "csrc/tiny.cu", "#ifndef TINY_BLOCK", "#if !defined(TINY_BLOCK)", "upstream style")
    env = _env(tmp_path)

    def kforge(*args: str) -> subprocess.CompletedProcess[str]:
        return kforge_testkit.kforge("-C", str(root), *args, env=env)

    st = kforge("patches", "status", "tiny", "--platform", "linux")
    assert st.returncode == 0, st.stdout + st.stderr
    assert "applies" in st.stdout and "skipped" in st.stdout

    bad = kforge("patches", "check", "tiny", "--rev", drift)
    assert bad.returncode == 1
    assert "0002-tiny.cu-256-threads-per-block.patch" in bad.stdout
    assert "csrc/tiny.cu, hunk 1" in bad.stdout and "#if !defined(TINY_BLOCK)" in bad.stdout
    assert "does NOT apply" in bad.stdout and "Traceback" not in bad.stderr

    applied = kforge("patches", "apply", "tiny", "--platform", "windows")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    work = root / ".kforge" / "work" / "tiny" / "tiny"
    assert "tiny_patched_for_sm120" in (work / "csrc" / "tiny.cu").read_text()
    assert git(root / "externals" / "tiny", "status", "--porcelain") == ""

    refused = kforge("patches", "apply", "tiny", "--tree", str(root / "externals" / "tiny"))
    assert refused.returncode == 6 and "inside externals" in refused.stderr

    reverted = kforge("patches", "revert", "tiny", "--platform", "windows")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert "tiny_patched_for_sm120" not in (work / "csrc" / "tiny.cu").read_text()


def _env(tmp_path: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["KFORGE_CACHE"] = str(tmp_path / "cache")
    env["COLUMNS"] = "200"
    return env


def test_refresh_from_an_uninitialised_submodule_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty externals/<name> inside the monorepo: git would find the monorepo's commits instead."""
    from kforge.errors import SourceError

    use_test_git_config(monkeypatch, tmp_path / "home")
    mono = tmp_path / "mono"
    (mono / "externals" / "tiny").mkdir(parents=True)
    shutil.copytree(TINY_PATCHES, mono / "patches" / "tiny")
    git(mono, "init", "-q")
    git(mono, "add", "-A")
    git(mono, "commit", "-q", "-m", "monorepo")
    before = sources.tree_hash(mono / "patches" / "tiny")
    with pytest.raises(SourceError, match="not a git checkout"):
        patches.refresh(mono / "patches" / "tiny", mono / "externals" / "tiny", "HEAD")
    assert sources.tree_hash(mono / "patches" / "tiny") == before


def test_cli_check_against_a_bare_mirror(upstream, tmp_path: Path) -> None:
    repo, base = upstream
    root = tmp_path / "mono"
    make_superproject(root, repo)
    write_forge(root, repo, base)
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(mirror)], check=True, capture_output=True)
    shutil.rmtree(root / "externals" / "tiny")  # no submodule checkout: the mirror is all there is
    env = _env(tmp_path)

    def kforge(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kforge.cli", "-C", str(root), *args],
                              capture_output=True, text=True, env=env)

    ok = kforge("patches", "check", "tiny", "--rev", base, "--repo", str(mirror), "--platform", "windows")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "the series applies" in ok.stdout
    missing = kforge("patches", "check", "tiny", "--rev", base)
    assert missing.returncode == 5 and "is not initialised" in missing.stderr and "--repo" in missing.stderr
    bad = kforge("patches", "check", "tiny", "--rev", base, "--repo", str(tmp_path / "nowhere"))
    assert bad.returncode == 5 and "is not a git repository" in bad.stderr and "Traceback" not in bad.stderr
