"""What several subcommands share: the plan options on the command line, finding forge.toml and the wheelhouse,
and turning a target id into a Plan."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from kforge.build.host import HostFacts, detect_host, with_torch
from kforge.build.profiles import load_profile
from kforge.config import options
from kforge.config.forge import find_root, load_forge
from kforge.config.model import Forge
from kforge.config.targets import parse_target
from kforge.fsutil import cache_dir
from kforge.plan import Plan, PlanOptions, make_plan, profile_name

__all__ = ["add_plan_options", "cache_dir", "console", "forge_from_args", "plan_and_host", "plan_from_args", "wheelhouse_root"]


def console() -> Console:
    """A console as wide as the terminal, or 120 columns in logs (CI), so tables stay readable."""
    wide = sys.stdout.isatty() or os.environ.get("COLUMNS")
    return Console(width=None if wide else 120, soft_wrap=False)


def wheelhouse_root(args: argparse.Namespace) -> Path:
    """--wheelhouse, else $KFORGE_WHEELHOUSE, else <root>/wheelhouse (root from -C or the nearest forge.toml)."""
    if getattr(args, "wheelhouse", None):
        return Path(args.wheelhouse).resolve()
    if os.environ.get("KFORGE_WHEELHOUSE"):
        return Path(os.environ["KFORGE_WHEELHOUSE"]).resolve()
    if getattr(args, "root", None):
        return Path(args.root).resolve() / "wheelhouse"
    return find_root() / "wheelhouse"


def forge_from_args(args: argparse.Namespace) -> Forge:
    return load_forge(Path(args.root) if getattr(args, "root", None) else None)


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """The flags of kforge.config.options' table (--cuda, --profile, --backend, --max-jobs, ...) and --env."""
    options.add_arguments(parser)


def plan_from_args(args: argparse.Namespace, target_text: str, *, environ: Mapping[str, str] | None = None,
                   host: HostFacts | None = None) -> Plan:
    """Read forge.toml, resolve the target and make its plan (the only reading of forge.toml a build does)."""
    return plan_and_host(args, target_text, environ=environ, host=host)[0]


def plan_and_host(args: argparse.Namespace, target_text: str, *, environ: Mapping[str, str] | None = None,
                  host: HostFacts | None = None) -> tuple[Plan, HostFacts]:
    """The plan, and the host facts it was made from (with this interpreter's torch for a torch-ABI project).

    A build's later steps (preflight) must judge the same host the plan saw: a host without the torch probe
    would say "no torch" where the plan said "present".
    """
    environ = os.environ if environ is None else environ
    forge = forge_from_args(args)
    host = host or detect_host(environ)
    target = parse_target(forge, target_text, host.platform, gpu_arch=host.gpu_arch)
    if forge.projects[target.project].torch_abi and host.torch_version is None:
        host = with_torch(host, sys.executable)
    cli = {opt.name: getattr(args, opt.name, None) for opt in options.OPTIONS}
    opts = PlanOptions.from_cascade(environ, **cli, env=options.parse_env_pairs(args.env))
    build_profile = profile_name(forge.projects[target.project], opts.profile)  # its own measurements size the jobs
    profile = load_profile(cache_dir(environ), target.project, 1, build_profile)
    return make_plan(forge, target, host, opts, job_profile=profile), host
