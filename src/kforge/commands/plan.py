"""``kforge plan <target>``: print what a build will do, before it spends an hour doing it."""

from __future__ import annotations

import argparse

from kforge.commands._common import add_plan_options, plan_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="print the resolved plan of a target (source, patches, env, flags, toolchain)")
    p.add_argument("target", help="<project>-<arch>[-<platform>], e.g. flashmla-sm120 or flash-attn-sm120-windows")
    add_plan_options(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args, args.target)
    print(plan.to_json() if args.json else plan.render(verbose=args.verbose))
    return 0
