"""``kforge ci generate [--check]``: the GitHub Actions workflow, generated from forge.toml."""

from __future__ import annotations

import argparse

from kforge.commands._common import forge_from_args
from kforge.errors import ConfigError
from kforge.workflows import write_workflow


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ci", help="generate .github/workflows/kforge.yml from the matrix")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    g = verbs.add_parser("generate", help="write the workflow (atomically)")
    g.add_argument("--check", action="store_true", help="write nothing; exit non-zero if the file is out of date")
    g.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    path, changed = write_workflow(forge, check=args.check)
    if args.check and changed:
        raise ConfigError(f"{path} is out of date with forge.toml", fix="run `kforge ci generate` (or `invoke ci.generate`) and commit it")
    print(f"{path}: {'up to date' if not changed else 'written'}")
    return 0
