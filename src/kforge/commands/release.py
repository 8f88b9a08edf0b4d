"""``kforge release <project>``: plan, price and build a project's release matrix into one wheelhouse."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kforge import options
from kforge.commands._common import add_plan_options, forge_from_args, wheelhouse_root
from kforge.fsutil import cache_dir
from kforge.host import detect_host, with_torch
from kforge.log import StepLog
from kforge.pipeline import Run, Services, steps_for
from kforge.plan import Plan, PlanOptions
from kforge.release import plan_release, run_release


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("release", help="build a project's release matrix (archs x variants) into one wheelhouse, "
                                       "skipping what is published with identical inputs")
    p.add_argument("project", help="a project with a [projects.NAME.release] table in forge.toml")
    add_plan_options(p)
    p.add_argument("--wheelhouse", type=Path, help="where to publish (default: <root>/wheelhouse, or $KFORGE_WHEELHOUSE)")
    p.add_argument("--dry-run", action="store_true", help="print the matrix, what is already published and the cost; build nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the release plan as JSON")
    p.add_argument("--allow-dirty", action="store_true", help="build a dirty submodule anyway (such wheels are never skipped later)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar (plain log lines)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    forge = forge_from_args(args)
    project = forge.project(args.project)
    host = detect_host(environ)
    if project.torch_abi and host.torch_version is None:
        host = with_torch(host, sys.executable)
    cli = {opt.name: getattr(args, opt.name, None) for opt in options.OPTIONS}
    opts = PlanOptions.from_cascade(environ, **cli, env=options.parse_env_pairs(args.env))
    cache = cache_dir(environ)
    root = wheelhouse_root(args)
    rplan = plan_release(forge, project.name, host, opts, cache_dir=cache, wheelhouse_root=root)
    if args.dry_run and args.json:
        print(json.dumps(rplan.to_dict(), indent=2))
        return 0
    print(rplan.render(), flush=True)
    if args.dry_run:
        return 0
    # One compiler cache for every build of the release (every variant): kforge's, unless one is configured.
    environ.setdefault("CCACHE_DIR", str(cache / "ccache"))
    environ.setdefault("SCCACHE_DIR", str(cache / "sccache"))

    def make_run(plan: Plan, n: int) -> Run:
        log = StepLog(total=len(steps_for(plan)), title=f"{plan.id} {plan.variant.id if plan.variant else ''}".strip())
        return Run(host=host, environ=environ, wheelhouse_root=root, cache_dir=cache, services=Services.real(plan),
                   log=log, allow_dirty=args.allow_dirty, progress=not args.no_progress)

    result = run_release(rplan, make_run, say=lambda text: print(text, flush=True))
    skipped = len(rplan.items) - len(result.built)
    print(f"release {rplan.project}: built {len(result.built)}, skipped {skipped} (published with identical inputs); "
          f"index {root / 'simple'}; manifest {result.manifest}")
    return 0
