"""``kforge sources status|sync|fetch|verify|kit``: the upstream sources each project builds from."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kforge.commands._common import cache_dir, console, forge_from_args
from kforge.config.model import Forge, Project
from kforge.config.source import GitSource, SdistSource, Source
from kforge.errors import SourceError
from kforge.sources import kit, pinrefs
from kforge.sources import sdist as _sdist
from kforge.sources import upstream as sources
from kforge.sources.mirrors import ENV as MIRROR_ENV
from kforge.sources.mirrors import Mirrors

_STYLE = {
    "pinned": "green", "cached": "green", "present": "green", "not-fetched": "yellow",
    "missing": "red", "dirty": "red", "wrong-commit": "red", "in-kit": "green",
}
_MIRROR_HELP = (f"a directory of local git mirrors (<owner>+<name>/repo, <owner>+<name>.git, <owner>/<name>.git or "
                f"<name>.git); repeatable; also ${MIRROR_ENV}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sources", help="upstream sources: status, sync, fetch, verify pins, offline kit")
    verbs = p.add_subparsers(dest="sources_command", metavar="VERB", required=True)
    st = verbs.add_parser("status", help="each source: pinned, missing, dirty, wrong-commit, cached, not-fetched, in-kit",
                          description="Exit 0 when every source a build uses is ready, 1 when one is missing, dirty "
                                      "or at the wrong commit (nested submodules included).")
    st.add_argument("projects", nargs="*", help="only these projects (default: all)")
    st.add_argument("-q", "--quiet", action="store_true", help="print only the sources that are not ready (scripts)")
    st.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    st.set_defaults(func=run_status)
    sy = verbs.add_parser("sync", help="initialise submodules (recursively) at their pinned commits; fetch pinned sdists")
    sy.add_argument("projects", nargs="*")
    sy.add_argument("--mirror", action="append", default=[], metavar="DIR", help=_MIRROR_HELP)
    sy.set_defaults(func=run_sync)
    fe = verbs.add_parser("fetch", help="download pinned sdists into the cache and verify their sha256")
    fe.add_argument("projects", nargs="*")
    fe.set_defaults(func=run_fetch)
    ve = verbs.add_parser("verify", help="is each git pin on a branch or tag of its upstream (not only a PR ref)?",
                          description="Looks in the mirror of each pin's URL, else in its submodule checkout, else "
                                      "asks the remote (tips only). Exit 1 when a pin is on no branch and no tag, "
                                      "or could not be checked.")
    ve.add_argument("projects", nargs="*")
    ve.add_argument("--mirror", action="append", default=[], metavar="DIR", help=_MIRROR_HELP)
    ve.add_argument("--fetch", action="store_true",
                    help="first fetch branches and tags from origin into each checkout (network, or its mirror)")
    ve.set_defaults(func=run_verify)
    ki = verbs.add_parser("kit", help="the offline kit: build one here, install one on an offline host")
    kv = ki.add_subparsers(dest="kit_command", metavar="ACTION", required=True)
    kb = kv.add_parser("build", help="gather wheels, pinned sdists and git trees into OUT (see docs/patches.md)")
    kb.add_argument("out", type=Path, help="the kit folder to write (must not exist, or be empty)")
    kb.add_argument("--project", action="append", default=[], metavar="NAME", help="only these projects (repeatable)")
    kb.add_argument("--mirror", action="append", default=[], metavar="DIR", help=_MIRROR_HELP)
    kb.add_argument("--python", default="3.12", help="the host's Python for the wheels (default 3.12)")
    kb.add_argument("--platform", default="manylinux_2_28_x86_64",
                    help="the host's newest wheel platform tag (default manylinux_2_28_x86_64; older ones follow)")
    kb.add_argument("--no-wheels", dest="wheels", action="store_false", help="leave kforge's wheels out")
    kb.add_argument("--extras", default="dev",
                    help="kforge's extras to include, comma-separated (default dev: nox and invoke, which the "
                         "build sessions use); '' for none")
    kb.add_argument("--with", dest="extra", action="append", default=[], metavar="REQ",
                    help="also download this requirement's wheels (repeatable), e.g. ninja")
    kb.add_argument("--keep-all", dest="trim", action="store_false",
                    help=f"keep nested submodules' {', '.join(kit.gitarchive.NESTED_TRIM)} folders")
    kb.add_argument("--compression", choices=("xz", "gz"), default="xz",
                    help="for the git trees: xz (default, ~30%% smaller) or gz (faster)")
    kb.add_argument("--skip-nested", action="append", default=[], metavar="PATH",
                    help="leave this nested submodule out (e.g. csrc/composable_kernel, ROCm only); recorded")
    kb.add_argument("--nested-from", action="append", default=[], metavar="PATH=DIR",
                    help="archive DIR's files in place of nested submodule PATH when no mirror holds its commit "
                         "(recorded as a stand-in, not the pinned commit)")
    kb.set_defaults(func=run_kit_build)
    kin = kv.add_parser("install", help="verify KIT, pip-install its wheels offline, put its sources in the cache")
    kin.add_argument("kit", type=Path)
    kin.add_argument("--no-pip", dest="pip", action="store_false", help="only lay out the sources and sdists")
    kin.set_defaults(func=run_kit_install)


def _projects(forge: Forge, names: list[str]) -> list[Project]:
    return [forge.project(n) for n in names] if names else list(forge.projects.values())


def _specs(project: Project) -> Iterator[tuple[str, Source, bool]]:
    """(label, spec, is_primary) for each source a project declares."""
    for spec in (project.git, project.sdist, project.local):
        if spec is not None:
            yield project.name, spec, spec == project.source


def _where(spec: Source) -> str:
    if isinstance(spec, SdistSource):
        return f"{spec.name}=={spec.version}"
    return spec.path


def collect(forge: Forge, names: list[str], cache: Path) -> list[tuple[sources.SourceStatus, Source, bool]]:
    rows = []
    for project in _projects(forge, names):
        for label, spec, primary in _specs(project):
            rows.append((sources.status(forge.root, label, spec, cache_dir=cache), spec, primary))
    return rows


def render_status(rows: list[tuple[sources.SourceStatus, Source, bool]], out: Console) -> None:
    table = Table(title="upstream sources", title_justify="left")
    table.add_column("project", no_wrap=True)
    table.add_column("source", overflow="fold")
    table.add_column("pin", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for st, spec, primary in rows:
        pin = st.pin[:10] if st.kind == "git" else (spec.sha256[:10] if isinstance(spec, SdistSource) else "")
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
    out = console()
    if args.quiet:
        for st, spec, primary in rows:
            if primary and not st.ok:
                out.print(f"{st.name} ({_where(spec)}) is {st.state}: {st.detail}. Fix: {st.fix}", highlight=False,
                          markup=False)
    else:
        render_status(rows, out)
    # Exit 1 when a source a build uses is not ready (missing, dirty, wrong commit), so
    # `kforge sources status && ...` means what it says. An sdist not fetched yet is ready.
    return 1 if any(not st.ok and primary for st, _, primary in rows) else 0


def _mirrors(args: argparse.Namespace) -> Mirrors:
    mirrors = Mirrors.from_cascade(getattr(args, "mirror", []), os.environ)
    absent = [str(d) for d in mirrors.dirs if not d.is_dir()]
    if absent:
        raise SourceError(f"mirror directory {', '.join(absent)} does not exist",
                          why=f"it was given with --mirror or ${MIRROR_ENV}; without it git would go to the network",
                          fix="fix the path, or leave it out")
    return mirrors


def run_sync(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    out = console()
    mirrors = _mirrors(args)
    seen: set[object] = set()
    for project in _projects(forge, args.projects):
        for label, spec, _ in _specs(project):
            if spec in seen:
                continue
            seen.add(spec)
            if isinstance(spec, GitSource):
                st = sources.sync(forge.root, spec, name=label, mirrors=mirrors)
                via = f" (mirror {mirrors.find(spec.url)})" if mirrors.find(spec.url) else ""
                out.print(f"{label}: {spec.path} {st.state} at {spec.commit[:12]}{via}", highlight=False)
            elif isinstance(spec, SdistSource):
                _fetch_one(label, spec, out)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    out = console()
    mirrors = _mirrors(args)
    table = Table(title="git pins: on a branch or tag of their upstream?", title_justify="left")
    for col in ("project", "pin", "checked in", "verdict"):
        table.add_column(col, overflow="fold")
    bad = 0
    seen: dict[GitSource, pinrefs.PinReach] = {}
    for project in _projects(forge, args.projects):
        spec = project.git
        if spec is None:
            continue
        reach = seen.get(spec) or _reach(forge.root, spec, mirrors, fetch=args.fetch)
        seen[spec] = reach
        ok = reach.present and reach.released
        bad += 0 if ok else 1
        verdict = f"[green]release[/] {reach.summary()}" if ok else f"[red]NOT RELEASED[/] {reach.summary()}"
        table.add_row(project.name, spec.commit[:12], f"{reach.via} {reach.repo}", verdict)
    if not seen:
        raise SourceError("none of the selected projects has a git source", fix="name a project pinned to a git commit")
    out.print(table)
    if bad:
        out.print(f"[bold]{bad} pin(s) are not reachable from a branch or tag[/]: pin a commit on a release branch "
                  "or tag (forge.toml and the gitlink), or check with a mirror (--mirror DIR / "
                  f"${MIRROR_ENV}) or after `kforge sources sync`.", highlight=False)
    return 1 if bad else 0


def _reach(root: Path, spec: GitSource, mirrors: Mirrors, *, fetch: bool) -> pinrefs.PinReach:
    mirror = mirrors.find(spec.url)
    if mirror is not None:
        return pinrefs.check(mirror, spec.commit, via="mirror")
    checkout = root / spec.path
    if sources.is_checkout(checkout):
        if fetch:
            sources.run_git(["fetch", "--quiet", "--tags", "origin",
                             "+refs/heads/*:refs/remotes/origin/*"], cwd=checkout)
        return pinrefs.check(checkout, spec.commit, via="checkout")
    return pinrefs.check_remote(spec.url, spec.commit)


def run_kit_build(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    out = console()
    projects = _projects(forge, args.project)
    chosen: list[tuple[str, Source]] = []
    for project in projects:
        spec = project.source
        if isinstance(spec, (GitSource, SdistSource)) and all(spec != s for _, s in chosen):
            chosen.append((project.name, spec))
    isolated = kit.isolated_build_requires(projects)
    for name, reqs in isolated.items():
        if args.wheels:
            out.print(f"{name}: its isolated build installs {', '.join(reqs)}: their wheels go into the kit", highlight=False)
    requirements = list(dict.fromkeys([*args.extra, *(r for reqs in isolated.values() for r in reqs)]))
    manifest = kit.build(args.out, root=forge.root, sources=chosen, projects=[p.name for p in projects],
                         cache_dir=cache_dir(), mirrors=_mirrors(args),
                         target=kit.WheelTarget(args.python, args.platform), wheels=args.wheels,
                         extra_requirements=requirements, trim=args.trim,
                         extras=[e.strip() for e in args.extras.split(",") if e.strip()], skip_nested=args.skip_nested,
                         compression=args.compression, substitutes=_pairs(args.nested_from),
                         log=lambda line: out.print(line, highlight=False))
    for note in manifest.notes:
        out.print(f"[yellow]note[/] {note}", highlight=False)
    out.print(f"kit {args.out}: {len(manifest.entries)} files, {manifest.size / 1048576:.1f} MiB "
              f"({', '.join(manifest.projects)}). On the host: `python -m pip install --no-index --find-links "
              f"{args.out}/wheels '{manifest.requirement}' && kforge sources kit install {args.out}`", highlight=False,
              markup=False)
    return 0


def _pairs(items: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items:
        path, sep, folder = item.partition("=")
        if not sep or not path.strip() or not folder.strip():
            raise SourceError(f"--nested-from {item!r} is not PATH=DIR",
                              fix="write it as --nested-from 3rdparty/spdlog=/path/to/spdlog")
        out[path.strip().strip("/")] = Path(folder).expanduser()
    return out


def run_kit_install(args: argparse.Namespace) -> int:
    out = console()
    cache = cache_dir()
    manifest = kit.install(args.kit, cache_dir=cache, pip=args.pip, python=sys.executable)
    out.print(f"kit {args.kit} ({', '.join(manifest.projects)}, made {manifest.created}) verified; "
              f"{'wheels installed; ' if args.pip else ''}sources and sdists are in {cache}", highlight=False)
    for note in manifest.notes:
        out.print(f"[yellow]note[/] {note}", highlight=False)
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


def _fetch_one(label: str, spec: SdistSource, out: Console) -> None:
    got = _sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache_dir(), index_url=spec.index_url)
    how = "cached" if got.from_cache else "downloaded"
    out.print(f"{label}: {got.path.name} {how}, sha256 {got.sha256[:16]}… verified", highlight=False)
