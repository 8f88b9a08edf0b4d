"""``kforge release <project>``: plan, price and build a project's release matrix into one wheelhouse."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kforge.build.host import detect_host, with_torch
from kforge.commands._common import add_plan_options, forge_from_args, wheelhouse_root
from kforge.config import options
from kforge.errors import ConfigError, GpuTestError
from kforge.fsutil import cache_dir
from kforge.gputest import GpuTestOutcome, run_gpu_tests
from kforge.log import StepLog
from kforge.pipeline import Run, Services, steps_for
from kforge.plan import Plan, PlanOptions
from kforge.release import ReleaseItem, plan_release, run_release, variant_problem
from kforge.wheels.wheelhouse import PublishedWheel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("release", help="build a project's release matrix (archs x variants) into one wheelhouse, "
                                       "skipping what is published with identical inputs")
    p.add_argument("project", help="a project with a [projects.NAME.release] table in forge.toml")
    add_plan_options(p)
    p.add_argument("--wheelhouse", type=Path, help="where to publish (default: <root>/wheelhouse, or $KFORGE_WHEELHOUSE)")
    p.add_argument("--only", action="append", default=[], metavar="ARCH|VARIANT|ARCH/VARIANT",
                   help="build only this part of the matrix (repeatable): an arch (sm_90) or arch set name, a variant id "
                        "(cu130-torch2.11-cp312), or both (sm_90/cu130-torch2.11-cp312); --dry-run lists them")
    p.add_argument("--gpu-tests", action="store_true",
                   help="after building, run each selected wheel's GPU tests (as kforge test does) and record the outcome "
                        "in the release manifest; skipped without a usable GPU, failed with KFORGE_REQUIRE_GPU=1")
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
    if args.gpu_tests and project.gpu_tests is None:
        raise ConfigError(f"--gpu-tests: {project.name} declares no GPU tests",
                          fix=f"add gpu_tests = {{ paths = [...] }} to [projects.{project.name}], or drop --gpu-tests")
    rplan = plan_release(forge, project.name, host, opts, cache_dir=cache, wheelhouse_root=root, only=args.only)
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

    def gpu_test(item: ReleaseItem, wheel: PublishedWheel) -> GpuTestOutcome:
        problem = variant_problem(item)
        if problem:
            return GpuTestOutcome("skipped", problem, wheel.wheel)
        log = StepLog(total=3, title=f"test-{item.plan.id} {item.variant}")
        return run_gpu_tests(item.plan, host, wheelhouse_root=root, environ=environ, log=log, published=wheel,
                             check=False)

    result = run_release(rplan, make_run, say=lambda text: print(text, flush=True),
                         gpu_test=gpu_test if args.gpu_tests else None)
    skipped = len(rplan.items) - len(result.built)
    tested = ""
    if args.gpu_tests:
        counts = {s: sum(1 for g in result.gpu_tests if g.outcome.status == s) for s in ("passed", "failed", "error", "skipped")}
        tested = "; GPU tests: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) if result.gpu_tests else "; no wheels to test"
    print(f"release {rplan.project}: built {len(result.built)}, skipped {skipped} (published with identical inputs){tested}; "
          f"index {root / 'simple'}; manifest {result.manifest}")
    if result.gpu_failures:
        raise GpuTestError(
            f"the GPU tests of {len(result.gpu_failures)} of {len(result.gpu_tests)} wheels of release {rplan.project} "
            "did not pass: " + ", ".join(f"{g.wheel} ({g.outcome.status}: {g.outcome.reason})" for g in result.gpu_failures),
            why="the wheels are built and published; the release manifest records each wheel's outcome",
            fix=f"read the pytest output above and {result.manifest}")
    return 0
