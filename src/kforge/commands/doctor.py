"""``kforge doctor <wheel|dir|binary> [--expect-arch ...] [--exact] [--json]``: what is inside a wheel, by arch.

A wheel published by kforge is judged the way its build judged it: the repair policy, the expected
archs and exact mode come from the manifest next to it (:mod:`kforge.doctor.judgement`); ``--project``
takes the policy from forge.toml instead; flags given on the command line win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kforge.config.forge import load_forge
from kforge.config.repairpolicy import default_policy
from kforge.doctor import BinaryReport, WheelReport, check, inspect_binary, inspect_wheels, render_text, to_json
from kforge.doctor.checks import expected
from kforge.doctor.judgement import Judgement, from_manifest_file, manifest_for, with_overrides
from kforge.doctor.wheel import BINARY_NAME
from kforge.errors import DoctorError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "doctor",
        help="show the SASS/PTX archs, symbols and libraries of a wheel's binaries; fail on a missing arch",
        description=(
            "Inspect every ELF .so and PE .pyd/.dll in a wheel (or every wheel in a directory, or one bare binary): "
            "the CUDA archs in its fatbins, unresolved device-link symbols, NEEDED libraries and section sizes. "
            "Exits with the doctor error code when an --expect-arch is missing (with --exact: also when a binary "
            "carries an arch that was not asked for) or another error is found. A wheel with a kforge manifest next "
            "to it (<wheel>.manifest.json, as in the wheelhouse) is judged as its build judged it."
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
    p.add_argument("--exact", action="store_true",
                   help="every CUDA binary must carry exactly the --expect-arch archs: an extra SASS or PTX is an error")
    p.add_argument("--stripped", action="store_true",
                   help="no binary of the wheel's own may keep host debug info (.debug_* sections), as a build with "
                        "strip_debug makes it")
    p.add_argument("--json", action="store_true", help="print the report as JSON (findings included)")
    p.add_argument(
        "--policy",
        choices=("none", "torch", "torch-free"),
        default=None,
        help="repair policy to check libraries against: torch extension, torch-free, or none "
             "(default: the wheel's manifest, else --project, else torch)",
    )
    p.add_argument("--project", help="take the repair policy from this forge.toml project (when the wheel has no manifest)")
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
    fallback = _fallback(args, expect)
    findings = []
    for report in reports:
        judged = _judgement(report, path, fallback, args, expect)
        if judged.exact and not judged.expect:
            raise DoctorError("--exact needs the archs to hold the binaries to",
                              why=f"neither --expect-arch nor a manifest names them for {Path(report.path).name}",
                              fix="pass --expect-arch, e.g. --expect-arch sm_90,compute_90 --exact")
        policy = None if args.policy == "none" else judged.policy
        findings += check(report, expect_archs=list(judged.expect), policy=policy, exact=judged.exact,
                          exact_ptx=judged.exact_ptx, stripped=judged.stripped, ptxas_threads=judged.ptxas_threads)
        if judged.source and not args.json:
            sys.stderr.write(f"kforge doctor: {Path(report.path).name}: judged by its {judged.source} "
                             f"(policy {judged.policy.name}, {'exactly ' if judged.exact else ''}"
                             f"{' '.join(judged.expect) or 'no archs'})\n")
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


def _fallback(args: argparse.Namespace, expect: list[str]) -> Judgement:
    """The judgement for a wheel without a manifest: --project's policy from forge.toml, else --policy."""
    if args.project:
        forge = load_forge(Path(args.root) if getattr(args, "root", None) else None)
        project = forge.project(args.project)
        policy = default_policy(project.name, torch=project.torch_abi, cudart_shared=project.torch_abi,
                                extra=project.repair_exclude)
        return Judgement(policy=policy, expect=tuple(expect), exact=args.exact, stripped=args.stripped,
                         source="forge.toml project")
    policy = default_policy(torch=args.policy in (None, "torch"), cudart_shared=args.cudart_shared)
    return Judgement(policy=policy, expect=tuple(expect), exact=args.exact, stripped=args.stripped)


def _judgement(report: WheelReport | BinaryReport, path: Path, fallback: Judgement, args: argparse.Namespace,
               expect: list[str]) -> Judgement:
    if args.policy is not None or args.project or not isinstance(report, WheelReport):
        return fallback
    wheel = Path(report.path) if Path(report.path).is_file() else path
    manifest = manifest_for(wheel)
    if manifest is None:
        return fallback
    return with_overrides(from_manifest_file(manifest), expect=expect, exact=True if args.exact else None,
                          stripped=True if args.stripped else None)
