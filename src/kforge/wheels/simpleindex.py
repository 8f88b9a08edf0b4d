"""The wheelhouse's static index pages: PEP 503 HTML and PEP 691 JSON, for all wheels and per CUDA variant.

Layout (every page a static file; no server logic)::

    simple/index.html, simple/index.v1_json                 every distribution
    simple/<name>/index.html, simple/<name>/index.v1_json   its files, ``#sha256=`` / ``hashes``
    cu130/simple/...                                        the same, only wheels built with CUDA 13.0

``index.v1_json`` holds ``application/vnd.pypi.simple.v1+json`` (PEP 691, api-version 1.0), named as
bandersnatch names its static JSON pages: a web server that answers ``Accept:
application/vnd.pypi.simple.v1+json`` with that file (and that content type) gives pip the JSON API; over
``file://`` and plain servers pip reads ``index.html``. ``pip install --index-url <wheelhouse>/cu130/simple``
sees only CUDA 13.0 wheels. The caller (kforge.wheels.wheelhouse) gives :class:`IndexEntry` rows and writes the pages.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

INDEX_DIR = "simple"
JSON_PAGE = "index.v1_json"
JSON_CONTENT_TYPE = "application/vnd.pypi.simple.v1+json"
_CUDA_FOLDER = re.compile(r"^cu\d{2,4}$")


@dataclass(frozen=True)
class IndexEntry:
    name: str  # the normalized distribution name
    project: str  # the wheelhouse folder the wheel is in
    filename: str
    sha256: str
    cuda_tag: str | None  # cu130; None: not known (an old manifest)


def is_variant_folder(name: str) -> bool:
    """``cu130``: a per-CUDA index folder of the wheelhouse, not a project's."""
    return bool(_CUDA_FOLDER.match(name))


def cuda_tag(variant: str | None, cuda: str | None) -> str | None:
    """The per-CUDA folder of a wheel: from its variant id (``cu130-...``), else its manifest's CUDA (``13.0``)."""
    if variant:
        return variant.split("-", 1)[0]
    if cuda:
        major, _, minor = str(cuda).partition(".")
        if major.isdigit() and minor[:1].isdigit():
            return f"cu{major}{minor.split('.')[0]}"
    return None


def render_pages(entries: Iterable[IndexEntry], *, base: str = INDEX_DIR, html_pages: bool = True) -> dict[str, str]:
    """The pages of one index rooted at ``base`` (``simple`` or ``cu130/simple``): {relative path: text}."""
    by_name: dict[str, list[IndexEntry]] = {}
    for e in entries:
        by_name.setdefault(e.name, []).append(e)
    up = "../" * (base.count("/") + 2)  # from <base>/<name>/ back to the wheelhouse root
    pages: dict[str, str] = {}
    pages[f"{base}/{JSON_PAGE}"] = _json({"meta": {"api-version": "1.0"},
                                          "projects": [{"name": n} for n in sorted(by_name)]})
    if html_pages:
        pages[f"{base}/index.html"] = _page("Simple index", "\n".join(
            f'    <a href="{html.escape(n)}/">{html.escape(n)}</a><br/>' for n in sorted(by_name)))
    for name, items in sorted(by_name.items()):
        items = sorted(items, key=lambda e: (e.filename, e.project))
        pages[f"{base}/{name}/{JSON_PAGE}"] = _json({
            "meta": {"api-version": "1.0"}, "name": name,
            "files": [{"filename": e.filename, "url": f"{up}{e.project}/{e.filename}", "hashes": {"sha256": e.sha256}}
                      for e in items]})
        if html_pages:
            pages[f"{base}/{name}/index.html"] = _page(f"Links for {name}", "\n".join(
                f'    <a href="{up}{html.escape(e.project)}/{html.escape(e.filename)}#sha256={e.sha256}">'
                f"{html.escape(e.filename)}</a><br/>" for e in items))
    return pages


def all_pages(entries: Iterable[IndexEntry]) -> dict[str, str]:
    """Every page of the wheelhouse's indexes: ``simple/`` and each per-CUDA index, PEP 503 HTML and PEP 691 JSON."""
    entries = list(entries)
    pages = render_pages(entries)
    for tag in sorted({e.cuda_tag for e in entries if e.cuda_tag}):
        pages.update(render_pages([e for e in entries if e.cuda_tag == tag], base=f"{tag}/{INDEX_DIR}"))
    return pages


def _json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{body}\n  </body>\n</html>\n")
