"""Git submodule sources with real git: pins, dirty trees, wrong commits, scratch copies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import commit_change, git, make_superproject, make_upstream, use_test_git_config, write_forge  # noqa: E402
from kforge_testkit import kforge  # noqa: E402

from kforge.config.source import GitSource, LocalSource  # noqa: E402
from kforge.errors import SourceError  # noqa: E402
from kforge.sources import upstream as sources  # noqa: E402
from kforge.sources.upstream import SourceState  # noqa: E402

pytestmark = pytest.mark.integration

SUB = "externals/tiny"


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    use_test_git_config(monkeypatch, tmp_path / "home")
    upstream = tmp_path / "upstream"
    base = make_upstream(upstream)
    root = tmp_path / "mono"
    make_superproject(root, upstream, sub_path=SUB)
    spec = GitSource(path=SUB, url=upstream.as_uri(), commit=base)
    return root, upstream, base, spec


def test_pinned_checkout_reports_pinned(world) -> None:
    root, _, base, spec = world
    st = sources.status(root, "tiny", spec)
    assert st.state is SourceState.PINNED
    assert st.actual == base
    assert st.ok


def test_fresh_clone_reports_missing_with_fix_and_sync_initialises(world, tmp_path: Path) -> None:
    root, _, base, spec = world
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", root.as_uri(), str(clone))  # no --recurse-submodules, like CI
    st = sources.status(clone, "tiny", spec)
    assert st.state is SourceState.MISSING
    assert not st.ok
    assert "kforge sources sync tiny" in (st.fix or "")
    assert f"git submodule update --init --recursive -- {SUB}" in (st.fix or "")

    after = sources.sync(clone, spec, name="tiny")
    assert after.state is SourceState.PINNED
    assert git(clone / SUB, "rev-parse", "HEAD") == base


def test_dirty_tree_is_reported_and_refused(world, tmp_path: Path) -> None:
    root, _, _, spec = world
    (root / SUB / "csrc" / "tiny.cu").write_text("// edited in place\n")
    (root / SUB / "notes.txt").write_text("untracked\n")
    st = sources.status(root, "tiny", spec)
    assert st.state is SourceState.DIRTY
    assert "csrc/tiny.cu" in st.detail and "notes.txt" in st.detail
    with pytest.raises(SourceError) as err:
        sources.prepare(root, spec, tmp_path / "scratch", cache_dir=tmp_path / "cache")
    assert "--allow-dirty" in err.value.render()
    assert "dirty" in err.value.render()
    with pytest.raises(SourceError, match="(?i)local changes"):
        sources.sync(root, spec)


def test_wrong_commit_is_reported_refused_and_synced_back(world, tmp_path: Path) -> None:
    root, upstream, base, spec = world
    newer = commit_change(upstream, "csrc/tiny.cu", "#define TINY_BLOCK 128", "#define TINY_BLOCK 64", "smaller blocks")
    sub = root / SUB
    git(sub, "fetch", "-q", "origin")
    git(sub, "checkout", "-q", "--detach", newer)
    st = sources.status(root, "tiny", spec)
    assert st.state is SourceState.WRONG_COMMIT
    assert st.actual == newer
    assert base[:12] in st.detail and newer[:12] in st.detail
    with pytest.raises(SourceError, match="(?i)wrong-commit"):
        sources.prepare(root, spec, tmp_path / "scratch", cache_dir=tmp_path / "cache")

    # allowed on request, and the result says it is not the pinned source
    prepared = sources.prepare(root, spec, tmp_path / "scratch", cache_dir=tmp_path / "cache", allow_dirty=True)
    assert prepared.dirty and prepared.pin == newer
    assert "#define TINY_BLOCK 64" in (prepared.tree / "csrc" / "tiny.cu").read_text()

    assert sources.sync(root, spec).state is SourceState.PINNED
    assert git(sub, "rev-parse", "HEAD") == base


def test_sync_fetches_a_pin_the_checkout_does_not_have(world) -> None:
    root, upstream, _, _ = world
    newer = commit_change(upstream, "setup.py", 'TINY_CUDA_ARCHS", "80;90"', 'TINY_CUDA_ARCHS", "80;90;120"', "default archs")
    spec = GitSource(path=SUB, url=upstream.as_uri(), commit=newer)
    assert sources.status(root, "tiny", spec).state is SourceState.WRONG_COMMIT
    assert sources.sync(root, spec).state is SourceState.PINNED


def test_sync_rejects_a_commit_upstream_does_not_have(world) -> None:
    root, upstream, _, _ = world
    spec = GitSource(path=SUB, url=upstream.as_uri(), commit="1" * 40)
    with pytest.raises(SourceError, match="(?i)not in"):
        sources.sync(root, spec)


def test_superproject_gitlink_disagreeing_with_pin_is_named(world) -> None:
    root, upstream, base, _ = world
    newer = commit_change(upstream, "setup.py", 'TINY_CUDA_ARCHS", "80;90"', 'TINY_CUDA_ARCHS", "80;90;120"', "default archs")
    spec = GitSource(path=SUB, url=upstream.as_uri(), commit=newer)
    st = sources.status(root, "tiny", spec)
    assert st.state is SourceState.WRONG_COMMIT
    assert f"superproject records {base[:12]}" in st.detail
    assert sources.gitlink(root, SUB) == base


def test_prepare_exports_scratch_copy_and_keeps_checkout_pristine(world, tmp_path: Path) -> None:
    root, _, base, spec = world
    sub = root / SUB
    before = sources.tree_hash(sub)
    a = sources.prepare(root, spec, tmp_path / "work-a", cache_dir=tmp_path / "cache")
    b = sources.prepare(root, spec, tmp_path / "work-b", cache_dir=tmp_path / "cache")
    assert a.kind == "git" and a.pin == base and not a.dirty
    assert a.tree != b.tree
    assert not (a.tree / ".git").exists()
    # the export holds exactly the tracked files
    tracked = set(git(sub, "ls-files").splitlines())
    exported = {p.relative_to(a.tree).as_posix() for p in a.tree.rglob("*") if p.is_file()}
    assert exported == tracked
    # building in one copy changes neither the other copy nor the checkout
    (a.tree / "csrc" / "tiny.cu").write_text("// patched in scratch\n")
    assert (b.tree / "csrc" / "tiny.cu").read_text() != "// patched in scratch\n"
    assert sources.tree_hash(sub) == before
    assert git(sub, "status", "--porcelain") == ""


def test_allow_dirty_copies_local_edits(world, tmp_path: Path) -> None:
    root, _, _, spec = world
    (root / SUB / "csrc" / "tiny.cu").write_text("// local experiment\n")
    (root / SUB / "extra.txt").write_text("new file\n")
    prepared = sources.prepare(root, spec, tmp_path / "work", cache_dir=tmp_path / "cache", allow_dirty=True)
    assert prepared.dirty
    assert (prepared.tree / "csrc" / "tiny.cu").read_text() == "// local experiment\n"
    assert (prepared.tree / "extra.txt").is_file()


def test_scratch_inside_externals_is_refused(world, tmp_path: Path) -> None:
    root, _, _, spec = world
    with pytest.raises(SourceError, match="(?i)inside externals"):
        sources.prepare(root, spec, root / "externals" / "scratch", cache_dir=tmp_path / "cache")


def test_local_source_is_copied_with_content_pin(tmp_path: Path) -> None:
    root = tmp_path / "mono"
    (root / "kernels" / "fmha" / "build").mkdir(parents=True)
    (root / "kernels" / "fmha" / "fmha.cu").write_text("__global__ void k() {}\n")
    (root / "kernels" / "fmha" / "build" / "junk.o").write_bytes(b"\0")
    spec = LocalSource("kernels/fmha")
    assert sources.status(root, "fmha", spec).state is SourceState.PRESENT
    prepared = sources.prepare(root, spec, tmp_path / "work", cache_dir=tmp_path / "cache")
    assert (prepared.tree / "fmha.cu").is_file()
    assert not (prepared.tree / "build").exists()
    assert prepared.pin.startswith("local:")
    missing = sources.status(root, "nope", LocalSource("kernels/nope"))
    assert missing.state is SourceState.MISSING and missing.fix


def test_cli_status_on_fresh_clone_reports_missing_without_traceback(world, tmp_path: Path) -> None:
    root, upstream, base, _ = world
    write_forge(root, upstream, base)
    git(root, "add", "forge.toml", "patches")
    git(root, "commit", "-q", "-m", "forge.toml")
    clone = tmp_path / "ci-clone"
    git(tmp_path, "clone", "-q", root.as_uri(), str(clone))
    cmd = ["-C", str(clone), "sources", "status"]
    proc = kforge(*cmd, env=_env(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # not ready: `kforge sources status && build` must stop here
    assert "Traceback" not in out
    assert "missing" in out
    assert "kforge sources sync tiny" in out
    quiet = kforge(*cmd, "--quiet", env=_env(tmp_path))
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    assert quiet.stdout.strip().startswith("tiny (externals/tiny) is missing") and "┃" not in quiet.stdout
    strict = kforge(*cmd, "--strict", env=_env(tmp_path))
    assert strict.returncode == 1 and "Traceback" not in strict.stderr

    sync = kforge("-C", str(clone), "sources", "sync", env=_env(tmp_path))
    assert sync.returncode == 0, sync.stdout + sync.stderr
    proc = kforge(*cmd, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pinned" in proc.stdout
    quiet = kforge(*cmd, "--quiet", env=_env(tmp_path))
    assert quiet.returncode == 0 and quiet.stdout == ""


def _env(tmp_path: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["KFORGE_CACHE"] = str(tmp_path / "cache")
    env["COLUMNS"] = "200"
    return env


def test_nested_submodules_are_synced_and_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like flash-attention's csrc/cutlass: the upstream has a submodule of its own."""
    use_test_git_config(monkeypatch, tmp_path / "home")
    lib = tmp_path / "cutlass"
    lib.mkdir()
    git(lib, "init", "-q")
    (lib / "include").mkdir()
    (lib / "include" / "cutlass.h").write_text("#pragma once\n")
    git(lib, "add", "-A")
    git(lib, "commit", "-q", "-m", "lib")
    upstream = tmp_path / "upstream"
    make_upstream(upstream)
    git(upstream, "submodule", "--quiet", "add", lib.as_uri(), "csrc/cutlass")
    git(upstream, "commit", "-q", "-m", "add cutlass")
    pin = git(upstream, "rev-parse", "HEAD")
    root = tmp_path / "mono"
    make_superproject(root, upstream)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", root.as_uri(), str(clone))
    spec = GitSource(path=SUB, url=upstream.as_uri(), commit=pin)
    assert sources.sync(clone, spec).state is SourceState.PINNED
    assert (clone / SUB / "csrc" / "cutlass" / "include" / "cutlass.h").is_file()
    prepared = sources.prepare(clone, spec, tmp_path / "work", cache_dir=tmp_path / "cache")
    assert (prepared.tree / "csrc" / "cutlass" / "include" / "cutlass.h").is_file()


def test_scratch_dir_that_would_wipe_the_repo_is_refused(world, tmp_path: Path) -> None:
    root, _, _, spec = world
    with pytest.raises(SourceError, match="(?i)refusing to use"):
        sources.prepare(root, spec, root, cache_dir=tmp_path / "cache")
    assert (root / "README.md").is_file()
