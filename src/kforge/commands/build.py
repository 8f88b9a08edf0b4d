"""``kforge build <target>``: the whole chain, from plan to a verified wheel in the wheelhouse."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kforge.build.host import detect_host
from kforge.commands._common import add_plan_options, plan_and_host, wheelhouse_root
from kforge.fsutil import cache_dir
from kforge.log import StepLog
from kforge.pipeline import Run, Services, run_build, steps_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="plan, fetch, patch, build, repair, verify and publish one target's wheel")
    p.add_argument("target", help="<project>[-<arch>][-<platform>]; without an arch: this machine's GPU (or the project's default)")
    add_plan_options(p)
    p.add_argument("--wheelhouse", type=Path, help="where to publish (default: <root>/wheelhouse, or $KFORGE_WHEELHOUSE)")
    p.add_argument("--allow-dirty", action="store_true", help="build a dirty or mis-pinned submodule anyway (marked dirty in the manifest)")
    p.add_argument("--ctest", action="store_true", help="cmake backend: run ctest on the build before packing")
    p.add_argument("--replace", action="store_true",
                   help="replace a published wheel of the same file name and other bytes (refused otherwise)")
    p.add_argument("--no-wait", action="store_true",
                   help="fail at once if another build holds this target's work folder or the wheelhouse")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar (plain log lines)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    host = detect_host(environ)
    plan, host = plan_and_host(args, args.target, environ=environ, host=host)
    log = StepLog(total=len(steps_for(plan)) + 1, title=plan.id)
    with log.step("plan", plan.id):
        for line in plan.render().splitlines()[1:]:
            log.info(line.strip() if not line.startswith("    ") else "  " + line.strip())
    build = Run(host=host, environ=environ, wheelhouse_root=wheelhouse_root(args), cache_dir=cache_dir(environ),
                services=Services.real(plan), log=log, allow_dirty=args.allow_dirty, progress=not args.no_progress,
                ctest=args.ctest, replace=args.replace, wait=not args.no_wait)
    outcome = run_build(plan, build)
    for wheel in outcome.wheels:
        print(f"{plan.id}: {wheel}" + (f" ({outcome.repaired_tag})" if outcome.repaired_tag else ""))
    print(f"{plan.id}: done in {outcome.seconds:.0f} s" + (f"; manifest {outcome.manifest}" if outcome.manifest else ""))
    return 0
