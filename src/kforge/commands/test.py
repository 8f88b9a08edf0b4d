"""``kforge test <target>``: install the target's wheel from the wheelhouse index and run its GPU tests."""

from __future__ import annotations

import argparse
import os

from kforge.build.host import detect_host
from kforge.commands._common import add_plan_options, plan_and_host, wheelhouse_root
from kforge.gputest import run_gpu_tests


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("test", help="pip install the target's wheel from the wheelhouse index and run its GPU tests")
    p.add_argument("target", help="<project>[-<arch>][-<platform>]")
    add_plan_options(p)
    p.add_argument("--wheelhouse", help="the wheelhouse to install from (default: <root>/wheelhouse, or $KFORGE_WHEELHOUSE)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    host = detect_host(environ)
    plan, host = plan_and_host(args, args.target, environ=environ, host=host)
    outcome = run_gpu_tests(plan, host, wheelhouse_root=wheelhouse_root(args), environ=environ)
    print(f"test-{plan.id}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
    return 0
