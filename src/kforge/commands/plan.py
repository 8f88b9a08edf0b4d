"""``kforge plan <target>``: print what a build will do, before it spends an hour doing it."""

from __future__ import annotations

import argparse

from kforge.commands._common import add_plan_options, plan_from_args
from kforge.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="print the resolved plan of a target (source, patches, env, flags, toolchain)")
    p.add_argument("target", help="<project>-<arch>[-<platform>], e.g. flashmla-sm120 or flash-attn-sm120-windows")
    add_plan_options(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def render(plan: Plan) -> str:
    tc = plan.toolchain
    isolation = "isolated" if plan.build_isolation else "no build isolation: uses this interpreter's packages"
    lines = [
        f"plan {plan.id}  ({plan.target.platform})",
        f"  project     {plan.project.name}: {plan.project.description}",
        f"  source      {plan.source_kind} {plan.source_pin}",
        f"  patches     {plan.patches_dir or 'none'}"
        + (f" ({len(plan.patches)} for this build: {', '.join(plan.patches)})" if plan.patches else ""),
        f"  archs       {' '.join(a.sm for a in plan.archs)}",
        f"  profile     {plan.profile or 'none'}",
        f"  backend     {plan.backend} (build dir {plan.build_dir}, "
        f"{isolation})",
        f"  cuda        {tc.cuda} (from {tc.cuda_from}; needs >= {tc.min_cuda}): {tc.action}",
        f"  torch       {tc.torch or 'not needed (torch-free wheel)'}",
        f"  python      {tc.python}",
        f"  jobs        MAX_JOBS={plan.jobs.max_jobs} NVCC_THREADS={plan.jobs.nvcc_threads}: {plan.jobs.reason}",
        f"  version     +{plan.local_version}" if plan.local_version else "  version     no local label",
        "  nvcc flags  " + " ".join(plan.nvcc_flags),
    ]
    if plan.enforce is not None:
        held = "every CUDA binary holds exactly" if plan.enforce.exact else "every CUDA binary holds at least"
        lines += [f"  binaries    {held} {plan.enforce.contents()} (the doctor checks it)",
                  f"  enforce     {plan.enforce.describe()}"]
    lines += [
        "  env",
    ]
    lines += [f"    {key}={value}" for key, value in plan.env.items()]
    if plan.gpu_tests:
        lines.append(f"  gpu tests   {' '.join(plan.gpu_tests.paths)} {' '.join(plan.gpu_tests.args)}".rstrip())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    _, plan = plan_from_args(args, args.target)
    print(plan.to_json() if args.json else render(plan))
    return 0
