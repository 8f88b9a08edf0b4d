"""Sync through local mirrors (nested submodules too), offline, and nested-submodule status, with real git."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import LIB_URL, UPSTREAM_URL, git, make_lib, make_mirrored_world, use_test_git_config  # noqa: E402

from kforge.config.source import GitSource  # noqa: E402
from kforge.errors import SourceError  # noqa: E402
from kforge.sources import upstream as sources  # noqa: E402
from kforge.sources.mirrors import Mirrors  # noqa: E402
from kforge.sources.upstream import SourceState  # noqa: E402

pytestmark = pytest.mark.integration
SUB = "externals/tiny"


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    cfg = use_test_git_config(monkeypatch, tmp_path / "home")
    w = make_mirrored_world(tmp_path)
    # From here on, what a user's machine has: no blanket permission for file:// submodules
    # (kforge allows the file transport per call, for the mirrors it was given).
    cfg.write_text(cfg.read_text().replace('[protocol "file"]\n\tallow = always\n', ""))
    assert "protocol" not in cfg.read_text()
    w["spec"] = GitSource(path=SUB, url=UPSTREAM_URL, commit=str(w["pin"]))
    return w


def test_sync_without_a_mirror_fails_offline_and_says_how_to_fix(world) -> None:
    with pytest.raises(SourceError) as err:
        sources.sync(world["clone"], world["spec"], name="tiny")
    text = err.value.render()
    assert "--mirror" in text and "KFORGE_GIT_MIRROR" in text


def test_sync_through_mirrors_initialises_nested_submodules_and_writes_no_config(world) -> None:
    clone: Path = world["clone"]
    st = sources.sync(clone, world["spec"], name="tiny", mirrors=Mirrors((world["mirrors"],)))
    assert st.state is SourceState.PINNED, st
    assert git(clone / SUB, "rev-parse", "HEAD") == world["pin"]
    assert (clone / SUB / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h").is_file()
    assert git(clone / SUB / "csrc" / "cutlass", "rev-parse", "HEAD") == world["lib_commit"]
    # the mirror was used through -c url.<mirror>.insteadOf: origin still names upstream
    assert git(clone / SUB, "remote", "get-url", "origin") == UPSTREAM_URL
    assert git(clone / SUB / "csrc" / "cutlass", "remote", "get-url", "origin") == LIB_URL
    status = subprocess.run(["git", "submodule", "status", "--recursive"], cwd=clone, capture_output=True, text=True)
    assert not any(line.startswith("-") for line in status.stdout.splitlines()), status.stdout


def test_a_mirror_lacking_the_nested_pin_is_named(world, tmp_path: Path) -> None:
    mirrors: Path = world["mirrors"]
    stale = tmp_path / "stale"
    (stale / "NVIDIA").mkdir(parents=True)
    make_lib(tmp_path / "other-lib", {"x.h": "// another history\n"})
    git(stale / "NVIDIA", "clone", "-q", "--mirror", (tmp_path / "other-lib").as_uri(), "cutlass.git")
    # the stale directory comes first, so the nested URL is sent there
    with pytest.raises(SourceError) as err:
        sources.sync(world["clone"], world["spec"], name="tiny", mirrors=Mirrors((stale, mirrors)))
    text = err.value.render()
    assert "csrc/cutlass" in text and str(stale / "NVIDIA" / "cutlass.git") in text and "lacks" in text


def test_uninitialised_nested_submodule_is_missing_with_the_recursive_fix(world, tmp_path: Path) -> None:
    clone: Path = world["clone"]
    spec = world["spec"]
    sources.sync(clone, spec, name="tiny", mirrors=Mirrors((world["mirrors"],)))
    git(clone / SUB, "submodule", "deinit", "-q", "-f", "csrc/cutlass")
    st = sources.status(clone, "tiny", spec)
    assert st.state is SourceState.MISSING and not st.ok
    assert "csrc/cutlass" in st.detail
    assert f"git -C {SUB} submodule update --init --recursive" in (st.fix or "")
    with pytest.raises(SourceError, match="(?i)missing"):
        sources.prepare(clone, spec, tmp_path / "work", cache_dir=tmp_path / "cache")
    with pytest.raises(SourceError, match="nested submodule"):
        sources.export_checkout(clone / SUB, tmp_path / "export")
    # sync repairs it (offline, from the mirror), and the export then has the nested files
    assert sources.sync(clone, spec, name="tiny", mirrors=Mirrors((world["mirrors"],))).state is SourceState.PINNED
    prepared = sources.prepare(clone, spec, tmp_path / "work", cache_dir=tmp_path / "cache")
    assert (prepared.tree / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h").is_file()


def test_nested_submodule_at_another_commit_is_wrong_commit(world) -> None:
    clone: Path = world["clone"]
    spec = world["spec"]
    sources.sync(clone, spec, name="tiny", mirrors=Mirrors((world["mirrors"],)))
    nested = clone / SUB / "csrc" / "cutlass"
    (nested / "include" / "extra.h").write_text("// a local commit\n")
    git(nested, "add", "-A")
    git(nested, "commit", "-q", "-m", "local")
    st = sources.status(clone, "tiny", spec)
    assert st.state is SourceState.WRONG_COMMIT, st
    assert "csrc/cutlass" in st.detail and "not at the commit" in st.detail
    assert sources.sync(clone, spec, name="tiny", mirrors=Mirrors((world["mirrors"],))).state is SourceState.PINNED
    assert git(nested, "rev-parse", "HEAD") == world["lib_commit"]
