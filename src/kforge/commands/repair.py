"""``kforge repair``: repair one wheel with kforge's policy (cibuildwheel's repair command calls this).

It needs no forge.toml: inside a cibuildwheel container only the wheel and the flags are at hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kforge.errors import RepairError
from kforge.wheels import repair


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repair", help="auditwheel/delvewheel repair of one wheel with kforge's exclude policy")
    p.add_argument("--wheel", type=Path, required=True, help="the wheel to repair")
    p.add_argument("--dest-dir", type=Path, required=True, help="where the repaired wheel goes")
    p.add_argument("--target", default="", help="the target id (names the policy in the log)")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="another library never to bundle")
    p.add_argument("--torch-abi", action="store_true",
                   help="the wheel links torch: never bundle torch's libraries nor the shared CUDA runtime")
    p.add_argument("--plat", help="auditwheel --plat (default: the best tag the binaries allow)")
    p.add_argument("--strip-debug", action="store_true",
                   help="strip host debug info (.debug_*) from the wheel's own ELF binaries first (strip --strip-debug)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    wheel: Path = args.wheel
    if not wheel.is_file() or wheel.suffix != ".whl":
        raise RepairError(f"{wheel} is not a wheel file", fix="pass the path of a built .whl with --wheel")
    platform = "windows" if repair.platform_tag(wheel.name).startswith("win") else "linux"
    policy = repair.default_policy(args.target or "default", torch=args.torch_abi, cudart_shared=args.torch_abi,
                                   extra=args.exclude)
    result = repair.repair_wheel(wheel, args.dest_dir, platform=platform, policy=policy, plat=args.plat,
                                 strip_debug=args.strip_debug)
    for note in result.notes:
        print(note)
    print(f"{result.wheel} ({result.tag}); excluded: {', '.join(result.excluded) or 'none'}; "
          f"grafted: {', '.join(result.grafted) or 'none'}")
    return 0
