"""``kforge doctor <wheel|dir|binary> [--expect-arch ...] [--json]``: what is inside a wheel, by arch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kforge.doctor import (
    BinaryReport,
    WheelReport,
    check,
    inspect_binary,
    inspect_wheels,
    render_text,
    to_json,
)
from kforge.doctor.checks import expected
from kforge.doctor.wheel import BINARY_NAME
from kforge.errors import DoctorError
from kforge.repairpolicy import default_policy


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "doctor",
        help="show the SASS/PTX archs, symbols and libraries of a wheel's binaries; fail on a missing arch",
        description=(
            "Inspect every ELF .so and PE .pyd/.dll in a wheel (or every wheel in a directory, or one bare binary): "
            "the CUDA archs in its fatbins, unresolved device-link symbols, NEEDED libraries and section sizes. "
            "Exits with the doctor error code when an --expect-arch is missing or another error is found."
        ),
    )
    p.add_argument("path", help="a .whl, a directory of wheels, or a .so/.pyd/.dll")
    p.add_argument(
        "--expect-arch",
        action="append",
        default=[],
        metavar="ARCH",
        help="an arch every CUDA binary must carry: sm_90a, sm_120f, sm_80 (SASS), compute_120a (PTX), sm_90+PTX (both); repeat or comma-separate",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (findings included)")
    p.add_argument(
        "--policy",
        choices=("none", "torch", "torch-free"),
        default="torch",
        help="repair policy to check libraries against: torch extension (default), torch-free, or none",
    )
    p.add_argument("--cudart-shared", action="store_true", help="the CUDA runtime is linked shared (so it must not be bundled)")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    expect = [a.strip() for item in args.expect_arch for a in item.split(",") if a.strip()]
    expected(expect)  # an ArchError for a misspelt arch, before any work
    path = Path(args.path)
    if not path.exists():
        raise DoctorError(f"no such file or directory: {path}", why="kforge doctor needs something to inspect", fix="pass a .whl, a directory of wheels, or a .so/.pyd/.dll")
    reports: list[WheelReport | BinaryReport]
    if path.is_file() and BINARY_NAME.search(path.name):
        reports = [inspect_binary(path)]
    else:
        if path.is_file() and path.suffix.lower() != ".whl":
            raise DoctorError(f"{path} is not a wheel", why="its name does not end in .whl", fix="pass a .whl, a directory of wheels, or a .so/.pyd/.dll")
        reports = list(inspect_wheels(path))
    policy = None if args.policy == "none" else default_policy(torch=args.policy == "torch", cudart_shared=args.cudart_shared)
    findings = [f for r in reports for f in check(r, expect_archs=expect, policy=policy)]
    if args.json:
        sys.stdout.write(to_json(reports[0] if len(reports) == 1 else reports, findings) + "\n")
    else:
        sys.stdout.write(render_text(reports, findings))
    errors = [f for f in findings if f.is_error]
    if errors:
        if not args.json:
            sys.stderr.write(f"kforge doctor: {len(errors)} error(s) found\n")
        return DoctorError.exit_code
    return 0
