"""The ``kforge`` command: wire the subcommands together, turn a KforgeError into a message and an exit code.

Each subcommand lives in ``kforge.commands.<name>`` and exposes ``register(subparsers)``,
which adds its parser and sets ``func`` to a handler ``(args) -> int``. This module only
wires them together and turns :class:`~kforge.errors.KforgeError` into a one-paragraph
message and an exit code (the traceback only with ``--verbose``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from kforge import __version__
from kforge.errors import KforgeError

#: Subcommand modules under kforge.commands, in the order ``kforge --help`` lists them.
COMMANDS = ("plan", "targets", "build", "test", "repair", "doctor", "sources", "patches", "wheelhouse", "ci", "image")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kforge",
        description="Cut wheels of GPU attention kernels: plan, fetch, patch, build, repair, verify, publish.",
    )
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and subprocess output")
    parser.add_argument(
        "-C", "--root", default=None, help="the monorepo root holding forge.toml (default: search upwards from cwd)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"kforge.commands.{name}")
        except ModuleNotFoundError as exc:  # a command whose module has not been written yet
            if exc.name == f"kforge.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def report_error(exc: KforgeError, *, verbose: bool) -> None:
    if verbose:
        traceback.print_exception(exc)
    print(f"kforge: {exc.kind} error: {exc.render()}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.func(args) or 0)
    except KforgeError as exc:
        report_error(exc, verbose=args.verbose)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kforge targets | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
