"""``kforge audit <project>``: does upstream read the knobs kforge sets? (reads the pinned source's build scripts)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kforge.commands._common import cache_dir, forge_from_args
from kforge.config.model import Forge, Project
from kforge.errors import SourceError
from kforge.sources import audit
from kforge.sources import sdist as _sdist
from kforge.sources import upstream as sources
from kforge.sources.series import load_series


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="which env vars kforge sets does upstream read? which does it read that kforge ignores?")
    p.add_argument("project")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--repo", help="a clone or bare mirror of the upstream (default: the project's submodule)")
    where.add_argument("--tree", help="an unpacked source tree to read instead of the pin")
    where.add_argument("--sdist", help="an sdist archive to read (default for sdist projects: the cached pinned one)")
    p.add_argument("--rev", help="with a git source: the commit to read (default: the pin)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_audit)


def source_tree(args: argparse.Namespace, forge: Forge, project: Project) -> audit.Tree:
    """The tree to read: --tree, --sdist, --repo/--rev, or the project's pinned source."""
    if args.tree:
        return audit.dir_tree(Path(args.tree))
    if args.sdist:
        return audit.archive_tree(Path(args.sdist))
    git, sd, local = project.git, project.sdist, project.local
    if project.source is local and local is not None and not args.repo and not args.rev:
        return audit.dir_tree(forge.root / local.path)
    if project.source is sd and sd is not None and not args.repo and not args.rev:
        cached = _sdist.cached_sdist(cache_dir(), sd.name, sd.version, sd.sha256)
        if cached is None:
            raise SourceError(f"the pinned sdist {sd.name}=={sd.version} is not in the cache",
                              fix=f"kforge sources fetch {project.name}, or pass --sdist FILE / --tree DIR")
        return audit.archive_tree(cached)
    if git is None:
        raise SourceError(f"project {project.name} has no git source to read",
                          fix="pass --tree DIR with an unpacked source, or --sdist FILE")
    repo = Path(args.repo) if args.repo else forge.root / git.path
    if not sources.is_repository(repo):
        raise SourceError(f"{repo} is not a git repository",
                          fix=f"kforge sources sync {project.name}, or pass --repo with a clone or mirror of {git.url}")
    return audit.git_tree(repo, args.rev or git.commit)


def run_audit(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    project = forge.project(args.project)
    platform_env: dict[str, str] = {}
    for name in project.platforms:
        platform_env.update(forge.platforms[name].env)
    series = load_series(project.patches)
    report = audit.audit(project, source_tree(args, forge, project), platform_env=platform_env,
                         patches=[(e.name, e.path.read_text(encoding="utf-8", errors="replace")) for e in series.entries])
    if args.json:
        print(json.dumps(_as_dict(report), indent=2))
    else:
        for line in audit.render_text(report):
            print(line)
    problems = []
    if report.dead_knobs:
        problems.append("kforge sets variables nothing reads: " + ", ".join(audit.dead_knob_summary(report)))
    if report.version_mismatch:
        problems.append(f"forge.toml says upstream_version {report.version_declared}, the tree says "
                        f"{report.version_found[0] if report.version_found else '?'}")
    for line in problems:
        print(f"audit {project.name}: {line}")
    if not args.json:
        print(f"audit {project.name}: " + ("ok" if report.ok else "PROBLEMS (see above): fix forge.toml's knobs"))
    return 0 if report.ok else 1


def _as_dict(report: audit.AuditReport) -> dict:
    def site(s: audit.Site) -> dict:
        return {"file": s.file, "line": s.line, "text": s.text}

    return {
        "project": report.project,
        "source": report.source,
        "files": list(report.files),
        "version": {"declared": report.version_declared,
                    "found": report.version_found[0] if report.version_found else None,
                    "mismatch": report.version_mismatch},
        "knobs": [{"name": k.name, "origin": k.origin, "status": k.status, "upstream": [site(s) for s in k.upstream],
                   "other_reader": k.other_reader} for k in report.knobs],
        "ignored": [{"name": n, "sites": [site(s) for s in sites]} for n, sites in report.ignored],
        "arch_flags": [site(s) for s in report.arch_flags],
        "ok": report.ok,
    }
