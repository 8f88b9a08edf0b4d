"""``kforge sources status|sync|fetch``: the upstream sources each project builds from."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kforge import sdist as _sdist
from kforge import sources
from kforge.commands._common import cache_dir, console, forge_from_args
from kforge.config import Forge, Project
from kforge.errors import SourceError

_STYLE = {
    "pinned": "green", "cached": "green", "present": "green", "not-fetched": "yellow",
    "missing": "red", "dirty": "red", "wrong-commit": "red",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sources", help="upstream sources: status, sync submodules, fetch sdists")
    verbs = p.add_subparsers(dest="sources_command", metavar="VERB", required=True)
    st = verbs.add_parser("status", help="each source: pinned, missing, dirty, wrong-commit, cached, not-fetched")
    st.add_argument("projects", nargs="*", help="only these projects (default: all)")
    st.add_argument("--strict", action="store_true",
                    help="exit 1 if a source a build uses is missing, dirty or at the wrong commit")
    st.set_defaults(func=run_status)
    sy = verbs.add_parser("sync", help="initialise submodules at their pinned commits and fetch pinned sdists")
    sy.add_argument("projects", nargs="*")
    sy.set_defaults(func=run_sync)
    fe = verbs.add_parser("fetch", help="download pinned sdists into the cache and verify their sha256")
    fe.add_argument("projects", nargs="*")
    fe.set_defaults(func=run_fetch)


def _projects(forge: Forge, names: list[str]) -> list[Project]:
    return [forge.project(n) for n in names] if names else list(forge.projects.values())


def _specs(project: Project) -> Iterator[tuple[str, sources.Source, bool]]:
    """(label, spec, is_primary) for each source a project declares."""
    for spec in (project.git, project.sdist, project.local):
        if spec is not None:
            yield project.name, spec, spec == project.source


def _where(spec: sources.Source) -> str:
    if isinstance(spec, sources.SdistSource):
        return f"{spec.name}=={spec.version}"
    return spec.path


def collect(forge: Forge, names: list[str], cache: Path) -> list[tuple[sources.SourceStatus, sources.Source, bool]]:
    rows = []
    for project in _projects(forge, names):
        for label, spec, primary in _specs(project):
            rows.append((sources.status(forge.root, label, spec, cache_dir=cache), spec, primary))
    return rows


def render_status(rows: list[tuple[sources.SourceStatus, sources.Source, bool]], out: Console) -> None:
    table = Table(title="upstream sources", title_justify="left")
    table.add_column("project", no_wrap=True)
    table.add_column("source", overflow="fold")
    table.add_column("pin", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for st, spec, primary in rows:
        pin = st.pin[:10] if st.kind == "git" else (spec.sha256[:10] if isinstance(spec, sources.SdistSource) else "")
        where = f"{st.kind}{'' if primary else ' (alt)'} {_where(spec)}"
        state = f"[{_STYLE.get(str(st.state), 'white')}]{st.state}[/]"
        table.add_row(st.name, where, pin, state, st.detail)
    out.print(table)
    for st, spec, _primary in rows:
        if not st.ok and st.fix:
            out.print(f"[bold]{st.name}[/] ({_where(spec)}) is {st.state}: {st.fix}", highlight=False)


def run_status(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    rows = collect(forge, args.projects, cache_dir())
    render_status(rows, console())
    # A report, not a gate: exit 0 (a fresh clone without submodules is a normal state). With
    # --strict, exit 1 for a source a build would refuse (missing, dirty, wrong commit).
    return 1 if args.strict and any(not st.ok and primary for st, _, primary in rows) else 0


def run_sync(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    out = console()
    seen: set[object] = set()
    for project in _projects(forge, args.projects):
        for label, spec, _ in _specs(project):
            if spec in seen:
                continue
            seen.add(spec)
            if isinstance(spec, sources.GitSource):
                st = sources.sync(forge.root, spec, name=label)
                out.print(f"{label}: {spec.path} {st.state} at {spec.commit[:12]}", highlight=False)
            elif isinstance(spec, sources.SdistSource):
                _fetch_one(label, spec, out)
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    out = console()
    fetched = 0
    for project in _projects(forge, args.projects):
        if project.sdist is not None:
            _fetch_one(project.name, project.sdist, out)
            fetched += 1
    if fetched == 0:
        raise SourceError("none of the selected projects has an sdist source",
                          fix="`kforge sources sync` initialises git sources")
    return 0


def _fetch_one(label: str, spec: sources.SdistSource, out: Console) -> None:
    got = _sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache_dir(), index_url=spec.index_url)
    how = "cached" if got.from_cache else "downloaded"
    out.print(f"{label}: {got.path.name} {how}, sha256 {got.sha256[:16]}… verified", highlight=False)
