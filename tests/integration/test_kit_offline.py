"""The offline kit: build one from mirrors, install it on a 'host' without checkouts, build from it."""

from __future__ import annotations

import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import UPSTREAM_URL, make_mirrored_world, use_test_git_config, write_forge  # noqa: E402
from kforge_testkit import kforge  # noqa: E402

from kforge.config.source import GitSource  # noqa: E402
from kforge.errors import SourceError  # noqa: E402
from kforge.sources import kit  # noqa: E402
from kforge.sources import upstream as sources
from kforge.sources.mirrors import Mirrors  # noqa: E402
from kforge.sources.upstream import SourceState  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    use_test_git_config(monkeypatch, tmp_path / "home")
    w = make_mirrored_world(tmp_path)
    w["spec"] = GitSource(path="externals/tiny", url=UPSTREAM_URL, commit=str(w["pin"]))
    return w


def _names(archive: Path) -> set[str]:
    with tarfile.open(archive) as tf:
        return {m.name for m in tf.getmembers() if m.isfile()}


def test_build_from_mirrors_trims_nested_docs_and_records_everything(world, tmp_path: Path) -> None:
    out = tmp_path / "kit"
    manifest = kit.build(out, root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                         cache_dir=tmp_path / "cache", mirrors=Mirrors((world["mirrors"],)), wheels=False)
    git_entries = [e for e in manifest.entries if e.kind == "git"]
    assert len(git_entries) == 1 and git_entries[0].what == f"{UPSTREAM_URL}@{world['pin']}"
    archive = out / git_entries[0].path
    assert archive.name.endswith(".tar.xz")
    names = _names(archive)
    assert "tiny/csrc/tiny.cu" in names and "tiny/setup.py" in names
    assert "tiny/csrc/cutlass/include/cutlass/cutlass.h" in names  # the nested submodule's files
    assert not any(n.startswith(("tiny/csrc/cutlass/docs/", "tiny/csrc/cutlass/test/")) for n in names)  # trimmed
    record = json.loads(archive.with_name(archive.name + ".json").read_text())
    assert record["nested"] == [{"path": "csrc/cutlass", "url": "https://github.invalid/NVIDIA/cutlass.git",
                                 "commit": world["lib_commit"], "skipped": ""}]
    assert kit.verify(out).entries == manifest.entries
    # --keep-all keeps them
    full = kit.build(tmp_path / "kit-full", root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                     cache_dir=tmp_path / "cache", mirrors=Mirrors((world["mirrors"],)), wheels=False, trim=False,
                     compression="gz")
    assert full.entries[0].path.endswith(".tar.gz")
    assert "tiny/csrc/cutlass/docs/big.md" in _names(tmp_path / "kit-full" / full.entries[0].path)
    st = sources.status(world["root"], "tiny", world["spec"], cache_dir=tmp_path / "kit-full" / "cache")
    # a checkout, even an incomplete one (its nested submodule is not initialised), is what status
    # judges: the kit only stands in where there is no checkout at all
    assert st.state is SourceState.MISSING and "csrc/cutlass" in st.detail


def test_missing_nested_commit_fails_whole_unless_skipped(world, tmp_path: Path) -> None:
    only_top = tmp_path / "only-top"
    only_top.mkdir()
    os.symlink(Path(world["mirrors"]) / "acme+tiny.git", only_top / "acme+tiny.git")
    with pytest.raises(SourceError) as err:
        kit.build(tmp_path / "kit", root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                  cache_dir=tmp_path / "cache", mirrors=Mirrors((only_top,)), wheels=False)
    assert "csrc/cutlass" in err.value.render() and "--skip-nested" in err.value.render()
    assert not (tmp_path / "kit").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kit.part-")]  # nothing half written
    m = kit.build(tmp_path / "kit", root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                  cache_dir=tmp_path / "cache", mirrors=Mirrors((only_top,)), wheels=False,
                  skip_nested=["csrc/cutlass"])
    assert m.notes and "csrc/cutlass" in m.notes[0]


def test_host_without_checkouts_builds_from_the_installed_kit(world, tmp_path: Path) -> None:
    out = tmp_path / "kit"
    kit.build(out, root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
              cache_dir=tmp_path / "cache", mirrors=Mirrors((world["mirrors"],)), wheels=False)
    host = tmp_path / "host"  # a copy of the repo without .git and without externals/ (like the GPU host)
    host.mkdir()
    write_forge(host, world["upstream"], world["pin"])
    toml = (host / "forge.toml").read_text().replace(Path(world["upstream"]).resolve().as_uri(), UPSTREAM_URL)
    (host / "forge.toml").write_text(toml)
    host_cache = tmp_path / "host-cache"
    env = dict(os.environ, KFORGE_CACHE=str(host_cache), COLUMNS="200")
    env.pop("KFORGE_GIT_MIRROR", None)
    cli = ["-C", str(host), "sources"]
    before = kforge(*cli, "status", env=env)
    assert before.returncode == 1 and "missing" in before.stdout
    inst = kforge(*cli, "kit", "install", str(out), "--no-pip", env=env)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    after = kforge(*cli, "status", env=env)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "in-kit" in after.stdout
    st = sources.status(host, "tiny", world["spec"], cache_dir=host_cache)
    assert st.state is SourceState.IN_KIT and st.ok
    prepared = sources.prepare(host, world["spec"], tmp_path / "work", cache_dir=host_cache)
    assert prepared.pin == world["pin"] and not prepared.dirty
    assert (prepared.tree / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h").is_file()
    assert (prepared.tree / "setup.py").is_file()
    # KFORGE_CACHE pointing into the kit itself works too, with no install
    assert sources.status(host, "tiny", world["spec"], cache_dir=out / "cache").state is SourceState.IN_KIT


def test_a_damaged_kit_is_refused_and_nothing_is_installed(world, tmp_path: Path) -> None:
    out = tmp_path / "kit"
    manifest = kit.build(out, root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                         cache_dir=tmp_path / "cache", mirrors=Mirrors((world["mirrors"],)), wheels=False)
    archive = out / next(e.path for e in manifest.entries if e.kind == "git")
    archive.write_bytes(archive.read_bytes()[:-10])
    with pytest.raises(SourceError, match="damaged"):
        kit.install(out, cache_dir=tmp_path / "host-cache", pip=False)
    assert not (tmp_path / "host-cache").exists()
    # and a tampered cache archive is not used by status either
    (tmp_path / "c2" / "git").mkdir(parents=True)
    for p in (out / "cache" / "git").iterdir():
        (tmp_path / "c2" / "git" / p.name).write_bytes(p.read_bytes())
    assert sources.status(world["clone"], "tiny", world["spec"], cache_dir=tmp_path / "c2").state is SourceState.MISSING


def test_wheels_step_builds_kforge_then_downloads_for_the_target(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    root = Path(__file__).resolve().parents[2]

    def runner(argv):
        calls.append(list(argv))
        if argv[3] == "wheel":  # pretend pip built and downloaded
            (Path(argv[argv.index("-w") + 1]) / "kforge-0.1.0-py3-none-any.whl").write_bytes(b"whl")
        else:
            (Path(argv[argv.index("--dest") + 1]) / "rich-15.0.0-py3-none-any.whl").write_bytes(b"dep")

    m = kit.build(tmp_path / "kit", root=root, sources=[], projects=[], cache_dir=tmp_path / "cache",
                  mirrors=Mirrors(), target=kit.WheelTarget("3.12", "manylinux_2_28_x86_64"), runner=runner,
                  extra_requirements=["ninja"])
    assert [c[3] for c in calls] == ["wheel", "download"]
    download = calls[1]
    assert download[download.index("--python-version") + 1] == "3.12" and "cp312" in download
    plats = [download[i + 1] for i, a in enumerate(download) if a == "--platform"]
    assert plats[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in plats and "manylinux1_x86_64" in plats
    assert download[-2].endswith("kforge-0.1.0-py3-none-any.whl[dev]") and download[-1] == "ninja"
    assert sorted(e.path for e in m.entries) == ["wheels/kforge-0.1.0-py3-none-any.whl",
                                                 "wheels/rich-15.0.0-py3-none-any.whl"]
    installed: list[list[str]] = []
    kit.install(tmp_path / "kit", cache_dir=tmp_path / "hc", runner=installed.append, python="py")
    assert installed == [["py", "-m", "pip", "install", "--no-index", "--find-links",
                          str((tmp_path / "kit" / "wheels").resolve()), "kforge[dev]"]]


def test_existing_non_empty_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "x").write_text("keep me")
    with pytest.raises(SourceError, match="not empty"):
        kit.build(tmp_path / "kit", root=tmp_path, sources=[], projects=[], cache_dir=tmp_path / "c",
                  mirrors=Mirrors(), wheels=False)
    assert (tmp_path / "kit" / "x").read_text() == "keep me"


def test_nested_from_stands_in_for_an_unmirrored_submodule_and_says_so(world, tmp_path: Path) -> None:
    only_top = tmp_path / "only-top"
    only_top.mkdir()
    os.symlink(Path(world["mirrors"]) / "acme+tiny.git", only_top / "acme+tiny.git")
    stand_in = tmp_path / "cutlass-headers"
    (stand_in / "include" / "cutlass").mkdir(parents=True)
    (stand_in / "include" / "cutlass" / "cutlass.h").write_text("#pragma once // from a wheel\n")
    out = tmp_path / "kit"
    m = kit.build(out, root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                  cache_dir=tmp_path / "cache", mirrors=Mirrors((only_top,)), wheels=False,
                  substitutes={"csrc/cutlass": stand_in})
    assert any("replaced by the files of" in n and "not the pinned commit" in n for n in m.notes)
    archive = out / next(e.path for e in m.entries if e.kind == "git")
    assert "tiny/csrc/cutlass/include/cutlass/cutlass.h" in _names(archive)
    host = tmp_path / "host"
    host.mkdir()
    st = sources.status(host, "tiny", world["spec"], cache_dir=out / "cache")
    assert st.state is SourceState.IN_KIT and "stand-ins (not the pinned commit): csrc/cutlass" in st.detail
    # a name that matches no nested submodule is refused, and nothing is written
    with pytest.raises(SourceError, match="name no nested submodule"):
        kit.build(tmp_path / "kit2", root=world["clone"], sources=[("tiny", world["spec"])], projects=["tiny"],
                  cache_dir=tmp_path / "cache", mirrors=Mirrors((world["mirrors"],)), wheels=False,
                  skip_nested=["3rdparty/typo"])
    assert not (tmp_path / "kit2").exists()
