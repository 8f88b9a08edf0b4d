"""``kforge targets``: every target the matrix allows (the same list nox registers)."""

from __future__ import annotations

import argparse
import json

from kforge.commands._common import forge_from_args
from kforge.host import platform_name
from kforge.targets import expand_matrix


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("targets", help="list every target of the matrix")
    p.add_argument("--project", action="append", help="only these projects")
    p.add_argument("--json", action="store_true", help="print JSON (id, project, arch, platform)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    for name in args.project or ():
        forge.project(name)  # an unknown name is an error with a did-you-mean, not an empty list
    targets = [t for t in expand_matrix(forge, platform_name()) if not args.project or t.project in args.project]
    if args.json:
        print(json.dumps([{"id": t.id, "project": t.project, "arch": t.arch_names,
                           "archs": [a.sm for a in t.archs], "platform": t.platform} for t in targets], indent=2))
    else:
        for t in targets:
            print(f"{t.id:36} {t.arch_names:9} {t.platform}")
    return 0
