"""Fetch pinned sdists through a package index, verify sha256, unpack safely.

``pip download`` cannot fetch flash-attn's sdist (preparing its metadata imports torch),
so this module reads the index's PEP 691 (JSON) or PEP 503 (HTML) simple page itself,
downloads the one file, and checks its sha256 *before* anything is unpacked.
Works with ``https://`` indexes and with ``file://`` ones (tests build their own).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from kforge.errors import SourceError
from kforge.fsutil import atomic_write_bytes, sha256_file

DEFAULT_INDEX = "https://pypi.org/simple/"
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"

#: ``opener(url, accept) -> bytes``; tests and offline callers can inject their own.
Opener = Callable[[str, str], bytes]


@dataclass(frozen=True)
class IndexFile:
    """One file listed on an index's simple page."""

    filename: str
    url: str
    sha256: str | None


@dataclass(frozen=True)
class FetchedSdist:
    """An sdist in the cache whose sha256 was verified."""

    path: Path
    sha256: str
    url: str
    from_cache: bool


def default_opener(url: str, accept: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "kforge"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (index URL from config)
            return response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(
            f"could not read {url}",
            why=str(getattr(exc, "reason", exc)),
            fix="check the network and the project's index_url in forge.toml",
        ) from exc


class _LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_simple_page(body: bytes, page_url: str) -> list[IndexFile]:
    """Parse a PEP 691 JSON or PEP 503 HTML project page into files (URLs made absolute)."""
    text = body.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        return [
            IndexFile(f["filename"], urllib.parse.urljoin(page_url, f["url"]), f.get("hashes", {}).get("sha256"))
            for f in data.get("files", [])
        ]
    parser = _LinkParser()
    parser.feed(text)
    files = []
    for href, label in parser.links:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        sha = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        name = label or urllib.parse.unquote(url.rsplit("/", 1)[-1])
        files.append(IndexFile(name, url, sha))
    return files


def find_sdist(files: list[IndexFile], name: str, version: str) -> IndexFile:
    """The sdist of ``name==version`` among an index page's files."""
    want_name, want_version = canonicalize_name(name), _version(version)
    seen = []
    for f in files:
        try:
            fname, fversion = parse_sdist_filename(f.filename)
        except InvalidSdistFilename:
            continue
        if canonicalize_name(fname) != want_name:
            continue
        seen.append(str(fversion))
        if fversion == want_version:
            return f
    raise SourceError(
        f"the index lists no sdist for {name}=={version}",
        why=f"sdists listed: {', '.join(seen[-8:]) or 'none'}" + (" (last 8)" if len(seen) > 8 else ""),
        fix="check the version pinned in forge.toml",
    )


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise SourceError(f"'{text}' is not a valid version", fix="use a PEP 440 version in forge.toml") from exc


def resolve(name: str, version: str, *, index_url: str | None = None, opener: Opener | None = None) -> IndexFile:
    """Find the sdist's URL (and the index's sha256, if it gives one)."""
    opener = opener or default_opener
    base = (index_url or DEFAULT_INDEX).rstrip("/") + "/"
    page_url = urllib.parse.urljoin(base, canonicalize_name(name) + "/")
    if page_url.startswith("file:"):  # a directory index keeps its page in index.html
        page_url_file = page_url + "index.html"
        body = opener(page_url_file, _ACCEPT)
    else:
        body = opener(page_url, _ACCEPT)
    return find_sdist(parse_simple_page(body, page_url), name, version)


def cache_path(cache_dir: Path, name: str, version: str, sha256: str) -> Path:
    return Path(cache_dir) / "sdists" / f"{canonicalize_name(name)}-{version}-{sha256[:16]}"


def fetch(
    name: str,
    version: str,
    sha256: str | None,
    *,
    cache_dir: Path,
    index_url: str | None = None,
    opener: Opener | None = None,
) -> FetchedSdist:
    """Return the verified sdist from the cache, downloading it first if needed.

    ``sha256=None`` (only for ``patches check --sdist-version``) trusts the hash the index
    lists, and still verifies the download against it. A mismatch deletes the download
    and raises :class:`SourceError`; nothing is unpacked and nothing stays in the cache.
    """
    if sha256 is not None:
        cached = cached_sdist(cache_dir, name, version, sha256)
        if cached is not None:
            return FetchedSdist(cached, sha256, "", from_cache=True)
    entry = resolve(name, version, index_url=index_url, opener=opener)
    if sha256 is not None and entry.sha256 and entry.sha256.lower() != sha256.lower():
        raise _mismatch(name, version, sha256, entry.sha256, entry.url, source="the index lists")
    expected = (sha256 or entry.sha256 or "").lower()
    if not expected:
        raise SourceError(
            f"no sha256 to verify {entry.filename} against",
            why="forge.toml pins none and the index lists none",
            fix="pin sha256 for this sdist in forge.toml",
        )
    data = (opener or default_opener)(entry.url, "*/*")
    actual = hashlib.sha256(data).hexdigest()  # checked in memory: a bad download never reaches the cache
    if actual != expected:
        raise _mismatch(name, version, expected, actual, entry.url, source="the download has")
    final = atomic_write_bytes(cache_path(cache_dir, name, version, expected) / Path(entry.filename).name, data)
    return FetchedSdist(final, expected, entry.url, from_cache=False)


def cached_sdist(cache_dir: Path, name: str, version: str, sha256: str) -> Path | None:
    """The cached file if present *and* its bytes still hash to ``sha256``."""
    d = cache_path(cache_dir, name, version, sha256.lower())
    if not d.is_dir():
        return None
    for f in sorted(d.iterdir()):
        if f.name.startswith("."):
            continue
        if sha256_file(f) == sha256.lower():
            return f
    return None


def _mismatch(name: str, version: str, expected: str, actual: str, url: str, *, source: str) -> SourceError:
    return SourceError(
        f"sha256 mismatch for {name}=={version}: forge.toml pins {expected}, {source} {actual}",
        why=f"the file at {url} is not the one that was pinned; nothing was unpacked",
        fix="if upstream really re-released this version, review it and update the sha256 pin; otherwise check the index",
    )


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack an sdist (.tar.gz or .zip) into ``dest`` and return its single top directory.

    Members that would land outside ``dest`` (absolute paths, ``..``, links out) are refused.
    """
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    _check_member(member, archive)
                zf.extractall(staging)
        else:
            with tarfile.open(archive) as tf:
                for member in tf.getmembers():
                    _check_member(member.name, archive)
                    if member.issym() or member.islnk():
                        _check_member(os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname)), archive)
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(staging, filter="data")
                else:  # pragma: no cover (Python without PEP 706)
                    tf.extractall(staging)  # noqa: S202 (members checked above)
        tops = [p for p in staging.iterdir()]
        root = tops[0] if len(tops) == 1 and tops[0].is_dir() else staging
        final = dest / (root.name if root is not staging else archive.name.split(".tar")[0].removesuffix(".zip"))
        if final.exists():
            shutil.rmtree(final)
        os.replace(root, final)
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_member(name: str, archive: Path) -> None:
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep) or re.match(r"^[A-Za-z]:", name):
        raise SourceError(
            f"{archive.name} has a member outside its root: {name}",
            why="unpacking it could write anywhere; nothing was unpacked",
            fix="do not use this sdist",
        )


@contextmanager
def open_archive(archive: Path) -> Iterator[Callable[[str], bytes | None]]:
    """Yield ``read(relpath) -> bytes | None`` over an sdist's files, paths relative to its top
    directory, without unpacking it (``patches check --sdist-version`` reads only what it needs)."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            names = {_strip_top(n): n for n in zf.namelist() if not n.endswith("/")}
            yield lambda rel: zf.read(names[rel]) if rel in names else None
        return
    with tarfile.open(archive) as tf:
        members = {_strip_top(m.name): m for m in tf.getmembers() if m.isfile()}

        def read(rel: str) -> bytes | None:
            member = members.get(rel)
            fh = tf.extractfile(member) if member is not None else None
            return fh.read() if fh is not None else None

        yield read


def _strip_top(name: str) -> str:
    parts = name.lstrip("./").split("/", 1)
    return parts[1] if len(parts) == 2 else parts[0]
