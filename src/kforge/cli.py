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
from collections.abc import Mapping, Sequence

from kforge import __version__, runstatus
from kforge.config import inputs
from kforge.errors import KforgeError, as_error

#: Subcommand modules under kforge.commands, in the order ``kforge --help`` lists them.
COMMANDS = ("plan", "targets", "matrix", "build", "release", "test", "repair", "doctor", "sources", "patches", "audit",
            "wheelhouse", "ci", "image")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kforge",
        description="Cut wheels of GPU attention kernels: plan, fetch, patch, build, repair, verify, publish.",
    )
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show tracebacks and subprocess output (also: KFORGE_DEBUG=1)")
    parser.add_argument(
        "-C", "--root", default=None, help="the monorepo root holding forge.toml (default: search upwards from cwd)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"kforge.commands.{name}").register(sub)
    return parser


def report_error(exc: KforgeError, *, verbose: bool) -> None:
    if verbose:
        traceback.print_exception(exc)
    label = "error" if exc.kind == KforgeError.kind else f"{exc.kind} error"  # never "error error"
    print(f"kforge: {label}: {exc.render()}", file=sys.stderr)
    # nox reports every failure as exit 1: keep the kind for CI's job summary ($KFORGE_STATUS_FILE, if set)
    runstatus.record(os.environ, runstatus.RunStatus(" ".join(sys.argv[1:]), exc.exit_code, exc.kind, exc.render()))


def debug_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``KFORGE_DEBUG=1`` (any value but empty/0/false/no) shows tracebacks, like ``-v``."""
    value = (os.environ if environ is None else environ).get("KFORGE_DEBUG", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    verbose = args.verbose or debug_enabled()
    try:
        inputs.check_args(args, os.environ)
        return int(args.func(args) or 0)
    except KforgeError as exc:
        report_error(exc, verbose=verbose)
        return exc.exit_code
    except OSError as exc:  # a disk that filled up or went read-only under a step that had no better word for it
        if isinstance(exc, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        report_error(as_error(exc), verbose=verbose)
        return KforgeError.exit_code
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
