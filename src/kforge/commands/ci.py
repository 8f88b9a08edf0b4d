"""``kforge ci generate|toolchain|summary|cleanup``: the GitHub Actions workflow and the steps its jobs run."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from kforge import runstatus
from kforge.build import toolchain
from kforge.build.host import detect_host
from kforge.ci.workflows import CI_DIR, write_workflow
from kforge.commands._common import add_plan_options, forge_from_args, plan_and_host
from kforge.config.forge import find_root
from kforge.errors import ConfigError, ToolchainError
from kforge.fsutil import cache_dir
from kforge.plan import PROVISIONABLE_FROM


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ci", help="generate the GitHub Actions workflow; the steps its jobs run")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    g = verbs.add_parser("generate", help="write the workflows and the actionlint and zizmor configs under .github/ (atomically)")
    g.add_argument("--check", action="store_true", help="write nothing; exit non-zero if a file is out of date")
    g.set_defaults(func=run_generate)
    t = verbs.add_parser("toolchain", help="a build job's toolchain step: CUDA (provisioned from PyPI if allowed) and torch, as the plan needs")
    t.add_argument("target", help="<project>-<arch>[-<platform>]")
    add_plan_options(t)
    t.set_defaults(func=run_toolchain)
    s = verbs.add_parser("summary", help="write the job summary from $KFORGE_STATUS_FILE (the kind of failure, past nox's exit 1)")
    s.add_argument("job", help="the job's name, for the headline")
    s.set_defaults(func=run_summary)
    c = verbs.add_parser("cleanup", help="remove build trees, nox venvs and CI scratch (a persistent runner's last step)")
    c.set_defaults(func=run_cleanup)


def run_generate(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    paths, changed = write_workflow(forge, check=args.check)
    names = ", ".join(str(p) for p in paths)
    if args.check and changed:
        raise ConfigError(f"{names}: out of date with forge.toml",
                          fix="run `kforge ci generate` (or `invoke ci.generate`) and commit the result")
    print(f"{names}: {'written' if changed else 'up to date'}")
    return 0


def run_toolchain(args: argparse.Namespace) -> int:
    """Check (and where kforge can, provide) what the target's plan needs, before the build spends time."""
    environ = dict(os.environ)
    host = detect_host(environ)
    plan, host = plan_and_host(args, args.target, environ=environ, host=host)
    cuda = str(plan.toolchain.cuda)
    try:
        nvcc = toolchain.find_nvcc(environ, cuda=cuda)
        how = "installed"
    except ToolchainError:
        if plan.toolchain.cuda < PROVISIONABLE_FROM:
            raise
        nvcc = toolchain.provision_cuda(cuda, cache_dir(environ) / "toolkits")
        how = "provisioned from PyPI"
    print(f"{plan.id}: nvcc {nvcc.version} ({how}) at {nvcc.path}")
    if plan.project.torch_abi:
        torch = toolchain.detect_torch(sys.executable)
        if torch is None:
            raise ToolchainError(f"{plan.id} links torch, and {sys.executable} has no torch",
                                 fix=f"install torch=={plan.toolchain.torch} (the job's torch step) into that interpreter")
        print(f"{plan.id}: torch {torch.version} (cuda {torch.cuda}) in {sys.executable}")
    return 0


def run_summary(args: argparse.Namespace) -> int:
    path = os.environ.get(runstatus.STATUS_ENV, "").strip()
    runs = runstatus.read(Path(path)) if path else ()
    text = runstatus.summarize(args.job, runs, os.environ.get("JOB_STATUS"))
    print(text, end="")
    summary = os.environ.get("GITHUB_STEP_SUMMARY", "").strip()
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(text)
    return 0


def run_cleanup(args: argparse.Namespace) -> int:
    """Build trees, nox's venvs and CI scratch; the caches (.kforge/ccache, .kforge/cache) stay for the cache action."""
    root = Path(args.root).resolve() if args.root else find_root()
    for rel in (".kforge/work", ".nox", CI_DIR):
        path = root / rel
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            print(f"removed {path}")
    return 0
