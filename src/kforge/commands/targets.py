"""``kforge targets``: every target the matrix allows (the same list nox registers)."""

from __future__ import annotations

import argparse
import json
import sys

from kforge.build.host import platform_name
from kforge.commands._common import forge_from_args
from kforge.config.releasematrix import expand
from kforge.config.targets import expand_matrix


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("targets", help="list every target of the matrix")
    p.add_argument("--project", action="append", help="only these projects")
    p.add_argument("--json", action="store_true",
                   help="print JSON (id, project, arch, platform, and the release matrix's variant ids for that arch)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    for name in args.project or ():
        forge.project(name)  # an unknown name is an error with a did-you-mean, not an empty list
    targets = [t for t in expand_matrix(forge, platform_name()) if not args.project or t.project in args.project]
    if args.json:
        python = f"{sys.version_info.major}.{sys.version_info.minor}"  # a variant without a Python: this one's

        def variants(t):  # type: ignore[no-untyped-def]
            release = forge.projects[t.project].release
            if release is None:
                return []
            bases = tuple(a.base for a in t.archs)  # one arch, or an arch set the release matrix names
            return [b.variant.id for b in expand(release, python) if tuple(a.base for a in b.archs) == bases]

        print(json.dumps([{"id": t.id, "project": t.project, "arch": t.arch_names, "archs": [a.sm for a in t.archs],
                           "platform": t.platform, "variants": variants(t)} for t in targets], indent=2))
    else:
        for t in targets:
            print(f"{t.id:36} {t.arch_names:9} {t.platform}")
    return 0
