"""``kforge patches status|apply|revert|refresh|check <project>``: the patch queue of a project."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kforge.build.host import platform_name
from kforge.commands._common import cache_dir, console, forge_from_args
from kforge.config.model import Forge, Project
from kforge.config.source import GitSource, SdistSource
from kforge.cuda.arch import parse_arch
from kforge.errors import PatchError, SourceError
from kforge.sources import patches
from kforge.sources import upstream as sources
from kforge.sources.series import PatchContext, Series, load_series

_STYLE = {"applies": "green", "applied": "cyan", "skipped": "dim", "fails": "red", "ambiguous": "yellow"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patches", help="a project's patch series: status, apply, revert, refresh, check")
    verbs = p.add_subparsers(dest="patches_command", metavar="VERB", required=True)

    def verb(name: str, help: str, func) -> argparse.ArgumentParser:  # noqa: ANN001
        v = verbs.add_parser(name, help=help)
        v.add_argument("project")
        v.add_argument("--platform", help="build platform for conditional entries (default: this host's)")
        v.add_argument("--arch", action="append", default=[],
                       help="build arch for conditional entries, repeatable (default: all the project's archs)")
        v.add_argument("--upstream-version", help="override the project's upstream_version")
        v.set_defaults(func=func)
        return v

    verb("status", "per patch: applies / applied / fails (file, hunk, and what upstream has there)", run_status) \
        .add_argument("--tree", help="report against this tree instead of the pinned source")
    a = verb("apply", "apply the series atomically to a scratch tree (never to externals/)", run_apply)
    a.add_argument("--tree", help="tree to patch (default: a fresh scratch copy under .kforge/work/<project>)")
    a.add_argument("--allow-dirty", action="store_true", help="copy a dirty or mis-pinned checkout anyway")
    r = verb("revert", "undo the series in a tree, atomically", run_revert)
    r.add_argument("--tree", help="tree to revert (default: .kforge/work/<project>)")
    f = verb("refresh", "regenerate the series from a working branch rebased onto the new pin", run_refresh)
    f.add_argument("--repo", help="git repository holding the branch (default: the project's submodule)")
    f.add_argument("--base", help="the pin the branch sits on (default: the project's pinned commit)")
    f.add_argument("--branch", default="HEAD", help="the working branch (default: HEAD of --repo)")
    c = verb("check", "does the series apply to an upstream version (default: the pinned one)? (touches no checkout)",
             run_check)
    g = c.add_mutually_exclusive_group()
    g.add_argument("--rev", help="an upstream commit (of the project's git source; default: the pinned commit)")
    g.add_argument("--sdist-version", help="an sdist version on the index (of the project's sdist source; "
                                           "default: the pinned version)")
    c.add_argument("--repo", help="with --rev (or the pinned commit): a clone or bare mirror of the upstream to "
                   "read it from (default: the project's submodule)")


# --------------------------------------------------------------------------- helpers


def _context(args: argparse.Namespace, forge: Forge, project: Project) -> PatchContext:
    platform = args.platform
    if platform is None:
        platform = platform_name()
    elif platform not in ("linux", "windows"):  # an OS, or a platform forge.toml declares (did-you-mean otherwise)
        platform = forge.platform(platform).name
    archs = tuple(parse_arch(a).sm for a in args.arch) or tuple(a.sm for a in project.archs)
    return PatchContext(platform, archs, args.upstream_version or project.upstream_version)


def _series(project: Project) -> Series:
    if project.patches is None:
        raise PatchError(f"project {project.name} has no patch series",
                         fix=f"set patches = \"patches/{project.name}\" in forge.toml and add a series file there")
    return load_series(project.patches)


def _work_dir(forge: Forge, project: Project) -> Path:
    return forge.root / ".kforge" / "work" / project.name


def _existing_work_tree(forge: Forge, project: Project) -> Path:
    work = _work_dir(forge, project)
    trees = [p for p in work.iterdir() if p.is_dir()] if work.is_dir() else []
    if len(trees) != 1:
        raise PatchError(f"no scratch tree of {project.name} under {work}",
                         fix=f"kforge patches apply {project.name}, or pass --tree")
    return trees[0]


def _guard(forge: Forge, tree: Path) -> Path:
    tree = tree.resolve()
    ext = (forge.root / "externals").resolve()
    if tree == ext or ext in tree.parents:
        raise PatchError(f"refusing to patch {tree}: it is inside externals/",
                         why="the pinned checkouts stay pristine; builds patch a scratch copy",
                         fix="omit --tree (kforge makes a scratch copy under .kforge/work/) or point it elsewhere")
    return tree


def render(statuses: tuple[patches.PatchStatus, ...], title: str, console: Console) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("#", no_wrap=True)
    table.add_column("patch", no_wrap=True)
    table.add_column("conditions", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for st in statuses:
        detail = st.message if st.state is not patches.PatchState.FAILS else \
            "; ".join(f.describe() for f in st.failures)
        table.add_row(str(st.position), st.name, st.entry.condition_text or "-",
                      f"[{_STYLE[str(st.state)]}]{st.state}[/]", detail)
    console.print(table)
    for st in statuses:
        for f in st.failures:
            console.print(f"\n[bold red]{st.name}[/] does not apply:", highlight=False)
            console.print(patches.hunk_report(f), highlight=False, markup=False)


def _pinned_statuses(forge: Forge, project: Project, series: Series, ctx: PatchContext) -> tuple[str, tuple]:
    spec = project.source
    if isinstance(spec, GitSource):
        repo = forge.root / spec.path
        st = sources.status(forge.root, project.name, spec)
        if st.state is sources.SourceState.MISSING:
            raise SourceError(f"cannot show the status of patches/{project.name}: {spec.path} is not initialised",
                              why="the series is checked against the pinned checkout, and a fresh clone (as in CI) "
                                  "has no submodules", fix=st.fix)
        report = patches.check_rev(repo, spec.commit, series, ctx, fetch=False)
        return f"{spec.path} @ {spec.commit[:12]}", report.statuses
    if isinstance(spec, SdistSource):
        report = patches.check_sdist(spec.name, spec.version, series, ctx, cache_dir=cache_dir(),
                                     sha256=spec.sha256, index_url=spec.index_url)
        return f"sdist {spec.name}=={spec.version}", report.statuses
    return spec.path, patches.status(forge.root / spec.path, series, ctx)


def _exit(statuses: tuple[patches.PatchStatus, ...]) -> int:
    bad = {patches.PatchState.FAILS, patches.PatchState.AMBIGUOUS}
    return 1 if any(s.state in bad for s in statuses) else 0


# --------------------------------------------------------------------------- verbs


def run_status(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    project = forge.project(args.project)
    series, ctx = _series(project), _context(args, forge, project)
    if args.tree:
        if not Path(args.tree).is_dir():
            raise PatchError(f"{args.tree} is not a directory", fix="pass --tree with an unpacked source tree")
        where, statuses = args.tree, patches.status(Path(args.tree), series, ctx)
    else:
        where, statuses = _pinned_statuses(forge, project, series, ctx)
    render(statuses, f"patches/{project.name} against {where} ({ctx.platform}; {' '.join(ctx.archs)})", console())
    return _exit(statuses)


def run_apply(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    project = forge.project(args.project)
    series, ctx = _series(project), _context(args, forge, project)
    if args.tree:
        tree = _guard(forge, Path(args.tree))
    else:
        prepared = sources.prepare(forge.root, project.source, _work_dir(forge, project),
                                   allow_dirty=args.allow_dirty, cache_dir=cache_dir(), name=project.name)
        tree = prepared.tree
    result = patches.apply(tree, series, ctx)
    print(f"{project.name}: applied {len(result.applied)}, already applied {len(result.already)}, "
          f"series {result.series_hash[:12]} -> {result.tree}")
    return 0


def run_revert(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    project = forge.project(args.project)
    series, ctx = _series(project), _context(args, forge, project)
    tree = _guard(forge, Path(args.tree)) if args.tree else _existing_work_tree(forge, project)
    result = patches.revert(tree, series, ctx)
    print(f"{project.name}: reverted {len(result.applied)}, not applied {len(result.already)} in {result.tree}")
    return 0


def run_refresh(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    project = forge.project(args.project)
    if project.patches is None:
        raise PatchError(f"project {project.name} has no patches directory", fix="set patches = ... in forge.toml")
    git = project.git
    repo = Path(args.repo) if args.repo else (forge.root / git.path if git else None)
    base = args.base or (git.commit if git else None)
    if repo is None or base is None:
        raise PatchError(f"project {project.name} has no git source to refresh from", fix="pass --repo and --base")
    result = patches.refresh(project.patches, repo, base, args.branch)
    print(f"{project.name}: {len(result.patches)} patches written to {result.directory}")
    for name in result.added:
        print(f"  new (unconditional): {name}")
    for name in result.removed:
        print(f"  dropped: {name}")
    for line in result.kept_conditions:
        print(f"  kept condition: {line}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    project = forge.project(args.project)
    series, ctx = _series(project), _context(args, forge, project)
    if not args.rev and not args.sdist_version:  # the pinned version of the source builds use
        if isinstance(project.source, GitSource):
            args.rev = project.source.commit
        elif isinstance(project.source, SdistSource):
            args.sdist_version = project.source.version
        else:
            raise PatchError(f"project {project.name} builds from a local folder, which has no upstream version",
                             fix=f"kforge patches status {project.name} checks the series against it")
        print(f"checking the pinned {'commit ' + args.rev if args.rev else 'sdist ' + args.sdist_version}")
    if args.rev:
        if project.git is None:
            raise PatchError(f"project {project.name} has no git source", fix="use --sdist-version")
        if args.repo:
            repo = Path(args.repo)
            if not sources.is_repository(repo):
                raise SourceError(f"--repo {args.repo} is not a git repository",
                                  fix="point --repo at a clone or a bare mirror of the project's upstream")
        else:
            repo = forge.root / project.git.path
            if not sources.is_checkout(repo):
                raise SourceError(f"{project.git.path} is not initialised",
                                  fix=f"kforge sources sync {project.name}, then re-run the check "
                                  "(or pass --repo with a clone or mirror of the upstream)")
        report = patches.check_rev(repo, args.rev, series, ctx)
    else:
        if project.sdist is None:
            raise PatchError(f"project {project.name} has no sdist source", fix="use --rev")
        sd = project.sdist
        if args.upstream_version is None:
            ctx = PatchContext(ctx.platform, ctx.archs, args.sdist_version)
        pinned = sd.sha256 if args.sdist_version == sd.version else None
        report = patches.check_sdist(sd.name, args.sdist_version, series, ctx, cache_dir=cache_dir(),
                                     sha256=pinned, index_url=sd.index_url)
    render(report.statuses, f"patches/{project.name} against {report.target}", console())
    if report.sha256:
        print(f"sha256 of {report.target}: {report.sha256}")
    print("the series applies" if report.ok else "the series does NOT apply: fix the failing patches before bumping")
    return 0 if report.ok else 1

