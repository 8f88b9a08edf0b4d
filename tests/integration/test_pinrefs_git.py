"""`kforge sources verify`: a pin on a branch, on a tag only, or only on refs/pull/* (real git repositories)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import (  # noqa: E402
    UPSTREAM_URL,
    commit_change,
    git,
    make_mirrored_world,
    make_upstream,
    mirror_clone,
    use_test_git_config,
    write_forge,
)
from kforge_testkit import kforge  # noqa: E402

from kforge.sources import pinrefs  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture()
def refs_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """main: A; tag v0.2.0 only: B (its branch deleted); refs/pull/7/head only: C (a PR's commit)."""
    use_test_git_config(monkeypatch, tmp_path / "home")
    up = tmp_path / "upstream"
    a = make_upstream(up)
    git(up, "checkout", "-q", "-b", "release-work")
    b = commit_change(up, "csrc/tiny.cu", "#define TINY_BLOCK 128", "#define TINY_BLOCK 64", "release 0.2.0")
    git(up, "tag", "v0.2.0")
    git(up, "checkout", "-q", "main")
    git(up, "branch", "-q", "-D", "release-work")
    git(up, "checkout", "-q", "-b", "pr")
    c = commit_change(up, "csrc/tiny.cu", "#define TINY_BLOCK 128", "#define TINY_BLOCK 32", "unmerged PR")
    git(up, "checkout", "-q", "main")
    mirror = mirror_clone(up, tmp_path / "mirrors" / "acme+tiny.git")
    git(mirror, "update-ref", "refs/pull/7/head", c)
    git(mirror, "branch", "-q", "-D", "pr")
    return {"up": up, "mirror": mirror, "a": a, "b": b, "c": c}


def test_branch_tag_and_pull_only_pins(refs_world) -> None:
    mirror: Path = refs_world["mirror"]
    on_main = pinrefs.check(mirror, refs_world["a"], via="mirror")
    assert on_main.present and on_main.released and on_main.branches == ("main",) and on_main.head_branch == "main"
    assert "branch main" in on_main.summary()
    on_tag = pinrefs.check(mirror, refs_world["b"], via="mirror")
    assert on_tag.released and on_tag.branches == () and on_tag.exact_tags == ("v0.2.0",)
    assert "tag v0.2.0" in on_tag.summary()
    pull = pinrefs.check(mirror, refs_world["c"], via="mirror")
    assert pull.present and not pull.released and pull.other_refs == ("refs/pull/7/head",)
    assert "on no branch and no tag" in pull.summary() and "refs/pull/7/head" in pull.summary()
    absent = pinrefs.check(mirror, "1" * 40, via="mirror")
    assert not absent.present and not absent.released


def test_remote_tips_only(refs_world) -> None:
    url = Path(refs_world["mirror"]).as_uri()
    assert pinrefs.check_remote(url, refs_world["b"]).exact_tags == ("v0.2.0",)
    assert not pinrefs.check_remote(url, refs_world["c"]).released
    assert "tip of no branch" in pinrefs.check_remote(url, refs_world["c"]).summary()


def _verify(root: Path, *args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="250", **(env_extra or {}))
    return kforge("-C", str(root), "sources", "verify", *args, env=env)


def test_cli_verify_exit_codes_and_names_the_refs(refs_world, tmp_path: Path) -> None:
    root = tmp_path / "mono"
    root.mkdir()
    mirrors = str(Path(refs_world["mirror"]).parent)
    for key, ok, shown in (("a", True, "branch main"), ("b", True, "tag v0.2.0"), ("c", False, "refs/pull/7/head")):
        shutil.rmtree(root / "patches", ignore_errors=True)
        write_forge(root, refs_world["up"], refs_world[key])
        toml = (root / "forge.toml").read_text().replace(Path(refs_world["up"]).resolve().as_uri(), UPSTREAM_URL)
        (root / "forge.toml").write_text(toml)
        proc = _verify(root, "--mirror", mirrors)
        out = proc.stdout + proc.stderr
        assert proc.returncode == (0 if ok else 1), out
        assert shown in out and "Traceback" not in out
        if not ok:
            assert "NOT RELEASED" in out
        via_env = _verify(root, env_extra={"KFORGE_GIT_MIRROR": mirrors})
        assert via_env.returncode == proc.returncode


def test_cli_verify_without_mirror_or_checkout_is_not_a_pass(refs_world, tmp_path: Path) -> None:
    root = tmp_path / "mono"
    root.mkdir()
    write_forge(root, refs_world["up"], refs_world["a"])
    toml = (root / "forge.toml").read_text().replace(Path(refs_world["up"]).resolve().as_uri(), UPSTREAM_URL)
    (root / "forge.toml").write_text(toml)
    proc = _verify(root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT RELEASED" in proc.stdout and "Traceback" not in proc.stderr


def test_cli_verify_in_a_synced_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_test_git_config(monkeypatch, tmp_path / "home")
    w = make_mirrored_world(tmp_path)
    clone: Path = w["clone"]
    write_forge(clone, w["upstream"], w["pin"])
    toml = (clone / "forge.toml").read_text().replace(Path(w["upstream"]).resolve().as_uri(), UPSTREAM_URL)
    (clone / "forge.toml").write_text(toml)
    env = {"KFORGE_GIT_MIRROR": str(w["mirrors"])}
    sync = kforge("-C", str(clone), "sources", "sync", env=dict(os.environ, **env))
    assert sync.returncode == 0, sync.stdout + sync.stderr
    proc = _verify(clone)  # no mirror now: the checkout's remote-tracking branches answer
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checkout" in proc.stdout and "branch main" in proc.stdout


def test_a_mirror_directory_that_does_not_exist_is_an_error(refs_world, tmp_path: Path) -> None:
    root = tmp_path / "mono"
    root.mkdir()
    write_forge(root, refs_world["up"], refs_world["a"])
    proc = _verify(root, "--mirror", str(tmp_path / "no-such-dir"))
    assert proc.returncode == 5 and "Traceback" not in proc.stderr
    assert "does not exist" in proc.stderr


def test_verify_of_a_project_without_a_git_pin_is_an_error(refs_world, tmp_path: Path) -> None:
    root = tmp_path / "mono"
    root.mkdir()
    write_forge(root, refs_world["up"], refs_world["a"])
    with open(root / "forge.toml", "a") as fh:
        fh.write('\n[projects.own]\ndescription = "ours"\nsource = { local = "kernels/own" }\narchs = ["sm_90a"]\n'
                 'platforms = ["linux-x86_64"]\n')
    proc = _verify(root, "own")
    assert proc.returncode == 5 and "has a git source" in proc.stderr and "Traceback" not in proc.stderr
