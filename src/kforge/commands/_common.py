"""What several subcommands share: finding forge.toml, host facts, and turning a target id into a Plan."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from kforge.config import Forge, load_forge
from kforge.errors import ConfigError
from kforge.host import HostFacts, detect_host, with_torch
from kforge.plan import Plan, PlanOptions, make_plan
from kforge.targets import parse_target


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$KFORGE_CACHE``, else ``$XDG_CACHE_HOME/kforge``, else ``~/.cache/kforge``."""
    environ = os.environ if environ is None else environ
    if environ.get("KFORGE_CACHE"):
        return Path(environ["KFORGE_CACHE"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kforge"


def wheelhouse_root(args: argparse.Namespace) -> Path:
    """--wheelhouse, else $KFORGE_WHEELHOUSE, else <root>/wheelhouse (root from -C or the nearest forge.toml)."""
    if getattr(args, "wheelhouse", None):
        return Path(args.wheelhouse).resolve()
    if os.environ.get("KFORGE_WHEELHOUSE"):
        return Path(os.environ["KFORGE_WHEELHOUSE"]).resolve()
    if getattr(args, "root", None):
        return Path(args.root).resolve() / "wheelhouse"
    from kforge.config import find_root

    return find_root() / "wheelhouse"


def forge_from_args(args: argparse.Namespace) -> Forge:
    return load_forge(Path(args.root) if getattr(args, "root", None) else None)


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cuda", help="CUDA version to build with, e.g. 12.8 (default: the installed nvcc)")
    parser.add_argument("--allow-unknown-cuda", action="store_true",
                        help="accept a --cuda/KFORGE_CUDA that is not a CUDA release kforge knows (on purpose)")
    parser.add_argument("--profile", help="a build profile from forge.toml, e.g. minimal")
    parser.add_argument("--backend", choices=("native", "cibuildwheel", "cmake"), help="override the project's backend")
    parser.add_argument("--max-jobs", type=_positive, help="parallel compile units (default: chosen from free memory)")
    parser.add_argument("--nvcc-threads", type=_positive, help="nvcc --threads per unit (default: chosen with --max-jobs)")
    parser.add_argument("--no-build-isolation", dest="build_isolation", action="store_const", const=False,
                        help="build with this interpreter's packages, not an isolated env (offline hosts)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra build environment, applied last")


def _positive(text: str) -> int:
    if not text.strip().isascii() or not text.strip().isdigit() or int(text) < 1:  # "²".isdigit() is True
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def parse_env_pairs(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--env {pair!r} is not KEY=VALUE", fix="write it as --env NVCC_THREADS=2")
        out[key.strip()] = value
    return out


def plan_from_args(args: argparse.Namespace, target_text: str, *, environ: Mapping[str, str] | None = None,
                   host: HostFacts | None = None) -> tuple[Forge, Plan]:
    environ = os.environ if environ is None else environ
    forge = forge_from_args(args)
    host = host or detect_host(environ)
    target = parse_target(forge, target_text, host.platform, gpu_arch=host.gpu_arch)
    if forge.projects[target.project].torch_abi and host.torch_version is None:
        host = with_torch(host, sys.executable)
    options = PlanOptions.from_cascade(
        environ,
        cuda=args.cuda,
        profile=args.profile,
        backend=args.backend,
        max_jobs=args.max_jobs,
        nvcc_threads=args.nvcc_threads,
        build_isolation=args.build_isolation,
        env=parse_env_pairs(args.env),
    )
    from kforge.jobs import load_profile

    profile = load_profile(cache_dir(environ), target.project, 1)
    plan = make_plan(forge, target, host, options, job_profile=profile,
                     cuda_from_env=bool(environ.get("KFORGE_CUDA")) and not args.cuda)
    return forge, plan
