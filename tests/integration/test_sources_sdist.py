"""Pinned sdists through a real (file://) PEP 503 index: fetch, cache, sha256, unpack, patch."""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_gitfixtures import TINY_PATCHES, UPSTREAM_TINY, use_test_git_config  # noqa: E402

from kforge.config.source import SdistSource  # noqa: E402
from kforge.errors import SourceError  # noqa: E402
from kforge.sources import patches, sdist  # noqa: E402
from kforge.sources import upstream as sources
from kforge.sources.series import PatchContext, load_series  # noqa: E402
from kforge.sources.upstream import SourceState  # noqa: E402

pytestmark = pytest.mark.integration


def make_sdist(dest_dir: Path, version: str = "0.1.0", *, edit: dict[str, str] | None = None) -> Path:
    """A real .tar.gz sdist of the tiny_upstream fixture (one top directory, like setuptools makes)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    top = f"tiny_upstream-{version}"
    path = dest_dir / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for f in sorted(UPSTREAM_TINY.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                rel = f.relative_to(UPSTREAM_TINY).as_posix()
                data = f.read_bytes()
                if edit and rel in edit:
                    data = edit[rel].encode()
                info = tarfile.TarInfo(f"{top}/{rel}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tf.addfile(info, io.BytesIO(data))
        pkg = f"Metadata-Version: 2.1\nName: tiny-upstream\nVersion: {version}\n".encode()
        info = tarfile.TarInfo(f"{top}/PKG-INFO")
        info.size = len(pkg)
        tf.addfile(info, io.BytesIO(pkg))
    return path


def make_index(index: Path, files: list[Path], *, advertise: dict[str, str] | None = None) -> str:
    """A PEP 503 directory index: simple/<project>/index.html linking the files with #sha256=."""
    page = index / "simple" / "tiny-upstream"
    page.mkdir(parents=True, exist_ok=True)
    links = []
    for f in files:
        sha = (advertise or {}).get(f.name) or hashlib.sha256(f.read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{f.name}#sha256={sha}">{f.name}</a><br/>')
    (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    return (index / "simple").as_uri() + "/"


@pytest.fixture()
def index(tmp_path: Path):
    files = tmp_path / "index" / "files"
    one = make_sdist(files, "0.1.0")
    two = make_sdist(files, "0.2.0", edit={"csrc/tiny.cu": (UPSTREAM_TINY / "csrc" / "tiny.cu").read_text()
                                            .replace("#ifndef TINY_BLOCK", "#if !defined(TINY_BLOCK)")})
    url = make_index(tmp_path / "index", [one, two])
    return url, one, two


def no_files(d: Path) -> bool:
    return not d.exists() or not any(p.is_file() for p in d.rglob("*"))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_verifies_caches_and_prepare_unpacks(index, tmp_path: Path) -> None:
    url, one, _ = index
    spec = SdistSource("tiny-upstream", "0.1.0", sha(one), index_url=url)
    cache = tmp_path / "cache"
    assert sources.status(tmp_path, "tiny", spec, cache_dir=cache).state is SourceState.NOT_FETCHED

    got = sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache, index_url=url)
    assert not got.from_cache and got.sha256 == sha(one)
    assert got.path.read_bytes() == one.read_bytes()
    st = sources.status(tmp_path, "tiny", spec, cache_dir=cache)
    assert st.state is SourceState.CACHED

    one.unlink()  # the index is gone: the cache serves it
    prepared = sources.prepare(tmp_path, spec, tmp_path / "work", cache_dir=cache)
    assert prepared.kind == "sdist" and prepared.pin == spec.sha256
    assert prepared.tree.name == "tiny_upstream-0.1.0"
    assert (prepared.tree / "csrc" / "tiny.cu").is_file()


def test_sha256_mismatch_is_a_hard_error_and_nothing_is_unpacked(index, tmp_path: Path) -> None:
    url, one, _ = index
    wrong = "0" * 64
    spec = SdistSource("tiny-upstream", "0.1.0", wrong, index_url=url)
    cache, work = tmp_path / "cache", tmp_path / "work"
    with pytest.raises(SourceError) as err:
        sources.prepare(tmp_path, spec, work, cache_dir=cache)
    assert "sha256 mismatch" in err.value.render() and wrong in err.value.render()
    assert "nothing was unpacked" in err.value.render()
    assert not any(work.iterdir())
    assert no_files(cache)


def test_tampered_file_behind_a_matching_index_hash_is_caught(tmp_path: Path) -> None:
    files = tmp_path / "index" / "files"
    good = make_sdist(files, "0.1.0")
    pinned = sha(good)
    url = make_index(tmp_path / "index", [good], advertise={good.name: pinned})
    good.write_bytes(good.read_bytes() + b"tampered")  # the bytes served differ from the pin
    spec = SdistSource("tiny-upstream", "0.1.0", pinned, index_url=url)
    cache, work = tmp_path / "cache", tmp_path / "work"
    with pytest.raises(SourceError, match="(?i)the download has"):
        sources.prepare(tmp_path, spec, work, cache_dir=cache)
    assert not any(work.iterdir())
    assert no_files(cache)


def test_corrupted_cache_entry_is_not_trusted(index, tmp_path: Path) -> None:
    url, one, _ = index
    spec = SdistSource("tiny-upstream", "0.1.0", sha(one), index_url=url)
    cache = tmp_path / "cache"
    got = sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache, index_url=url)
    got.path.write_bytes(b"corrupted")
    assert sources.status(tmp_path, "tiny", spec, cache_dir=cache).state is SourceState.NOT_FETCHED
    again = sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache, index_url=url)
    assert not again.from_cache and sha(again.path) == spec.sha256


def test_unknown_version_names_what_the_index_has(index, tmp_path: Path) -> None:
    url, _, _ = index
    with pytest.raises(SourceError) as err:
        sdist.fetch("tiny-upstream", "9.9", "0" * 64, cache_dir=tmp_path / "c", index_url=url)
    assert "0.1.0" in err.value.render() and "0.2.0" in err.value.render()


def test_check_sdist_version_reports_drift_and_the_sha_to_pin(index, tmp_path: Path, monkeypatch) -> None:
    use_test_git_config(monkeypatch, tmp_path / "home")
    url, one, two = index
    series = load_series(TINY_PATCHES)
    ctx = PatchContext("linux-x86_64", ("sm_90a",), "0.1.0")
    ok = patches.check_sdist("tiny-upstream", "0.1.0", series, ctx, cache_dir=tmp_path / "c", sha256=sha(one),
                             index_url=url)
    assert ok.ok and ok.sha256 == sha(one)
    bad = patches.check_sdist("tiny-upstream", "0.2.0", series, ctx, cache_dir=tmp_path / "c", index_url=url)
    assert not bad.ok
    assert bad.sha256 == sha(two)  # taken from the index and verified: the value to pin when bumping
    failing = [s for s in bad.statuses if s.failures]
    assert [s.name for s in failing] == ["0002-tiny.cu-256-threads-per-block.patch"]
    assert (failing[0].failures[0].file, failing[0].failures[0].hunk) == ("csrc/tiny.cu", 1)


def test_unpack_refuses_members_outside_the_root(tmp_path: Path) -> None:
    evil = tmp_path / "evil-0.1.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        data = b"x"
        info = tarfile.TarInfo("evil-0.1/../../escaped.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(data))
    with pytest.raises(SourceError, match="(?i)outside its root"):
        sdist.unpack(evil, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()
