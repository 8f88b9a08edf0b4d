"""Index page parsing, sdist selection, cache layout, tree hashing, source states (offline)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kforge.config.source import GitSource, SdistSource
from kforge.errors import SourceError
from kforge.sources import sdist
from kforge.sources import upstream as sources
from kforge.sources.upstream import SourceState

HTML = b"""<!DOCTYPE html><html><head><title>Links for flash-attn</title></head><body>
<a href="https://files.example/6c/b1/flash_attn-2.8.3.post2.tar.gz#sha256=d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b" data-requires-python="&gt;=3.9">flash_attn-2.8.3.post2.tar.gz</a><br/>
<a href="../../files/flash_attn-2.8.3.tar.gz#sha256=1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d">flash_attn-2.8.3.tar.gz</a><br/>
<a href="https://files.example/x/flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl">flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl</a>
</body></html>"""


def test_parse_pep503_html_page() -> None:
    files = sdist.parse_simple_page(HTML, "https://pypi.org/simple/flash-attn/")
    assert [f.filename for f in files][:2] == ["flash_attn-2.8.3.post2.tar.gz", "flash_attn-2.8.3.tar.gz"]
    assert files[0].url == "https://files.example/6c/b1/flash_attn-2.8.3.post2.tar.gz"
    assert files[0].sha256 == "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"
    assert files[1].url == "https://pypi.org/files/flash_attn-2.8.3.tar.gz"  # relative links resolved


def test_parse_pep691_json_page() -> None:
    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "flash-attn", "files": [
        {"filename": "flash_attn-2.8.3.post2.tar.gz", "url": "../../f/flash_attn-2.8.3.post2.tar.gz",
         "hashes": {"sha256": "ab" * 32}},
    ]}).encode()
    (f,) = sdist.parse_simple_page(body, "https://idx.example/simple/flash-attn/")
    assert f.url == "https://idx.example/f/flash_attn-2.8.3.post2.tar.gz" and f.sha256 == "ab" * 32


def test_find_sdist_matches_normalised_name_and_exact_version() -> None:
    files = sdist.parse_simple_page(HTML, "https://pypi.org/simple/flash-attn/")
    assert sdist.find_sdist(files, "Flash_Attn", "2.8.3").filename == "flash_attn-2.8.3.tar.gz"
    assert sdist.find_sdist(files, "flash-attn", "2.8.3.post2").filename == "flash_attn-2.8.3.post2.tar.gz"
    with pytest.raises(SourceError) as err:
        sdist.find_sdist(files, "flash-attn", "2.8.4")
    assert "2.8.3.post2" in err.value.render()  # says what the index does have


def test_resolve_uses_injected_opener_and_sends_pep691_accept() -> None:
    seen = []

    def opener(url: str, accept: str) -> bytes:
        seen.append((url, accept))
        return HTML

    f = sdist.resolve("flash_attn", "2.8.3.post2", index_url="https://pypi.org/simple", opener=opener)
    assert f.sha256.startswith("d0f9f0b0")
    assert seen[0][0] == "https://pypi.org/simple/flash-attn/"
    assert "application/vnd.pypi.simple.v1+json" in seen[0][1]


def test_index_hash_disagreeing_with_pin_fails_before_download(tmp_path: Path) -> None:
    calls = []

    def opener(url: str, accept: str) -> bytes:
        calls.append(url)
        return HTML

    with pytest.raises(SourceError, match="sha256 mismatch"):
        sdist.fetch("flash-attn", "2.8.3.post2", "f" * 64, cache_dir=tmp_path, opener=opener)
    assert calls == ["https://pypi.org/simple/flash-attn/"]  # the file itself was never requested
    assert not any(tmp_path.rglob("*.tar.gz"))


def test_tree_hash_sees_content_mode_names_and_empty_dirs(tmp_path: Path) -> None:
    t = tmp_path / "t"
    (t / "d").mkdir(parents=True)
    (t / "d" / "f.txt").write_text("a")
    h = sources.tree_hash(t)
    assert sources.tree_hash(t) == h
    (t / "d" / "f.txt").write_text("b")
    h2 = sources.tree_hash(t)
    assert h2 != h
    os.chmod(t / "d" / "f.txt", 0o755)
    h3 = sources.tree_hash(t)
    assert h3 != h2
    (t / "empty").mkdir()
    assert sources.tree_hash(t) != h3
    (t / "empty").rmdir()
    (t / "d" / "f.txt").rename(t / "d" / "g.txt")
    assert sources.tree_hash(t) != h3
    (t / ".git").mkdir()
    (t / ".git" / "HEAD").write_text("x")
    (t / "d" / "g.txt").rename(t / "d" / "f.txt")
    assert sources.tree_hash(t) == h3  # .git is not part of the tree


def test_status_of_unfetched_sdist_and_missing_git_source(tmp_path: Path) -> None:
    sd = SdistSource("flash-attn", "2.8.3.post2", "d0" * 32)
    st = sources.status(tmp_path, "flash-attn", sd, cache_dir=tmp_path / "cache")
    assert st.state is SourceState.NOT_FETCHED and st.ok and "kforge sources fetch" in (st.fix or "")
    git = GitSource("externals/FlashMLA", "https://github.com/deepseek-ai/FlashMLA.git", "3" * 40)
    st = sources.status(tmp_path, "flashmla", git)
    assert st.state is SourceState.MISSING and not st.ok
    assert "git submodule update --init --recursive -- externals/FlashMLA" in (st.fix or "")
