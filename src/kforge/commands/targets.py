"""``kforge targets``: every target the matrix allows (the same list nox registers)."""

from __future__ import annotations

import argparse
import json
import sys

from kforge.build.host import platform_name
from kforge.ci.workflows import ci_targets
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
        print_table(targets, here=platform_name(), in_ci={c.session_id for c in ci_targets(forge)})
    return 0


def print_table(targets, *, here: str, in_ci: set[str]) -> None:  # type: ignore[no-untyped-def]
    """One row per target, with a header, and a note where a target needs another host or CI leaves it out."""
    wid = max([len("TARGET"), *(len(t.id) for t in targets)])
    war = max([len("ARCHS"), *(len(t.arch_names) for t in targets)])
    wpl = max([len("PLATFORM"), *(len(t.platform) for t in targets)])
    print(f"{'TARGET':{wid}}  {'ARCHS':{war}}  {'PLATFORM':{wpl}}  NOTE")
    for t in targets:
        notes = ([f"needs a {t.platform} host"] if t.platform != here else []) + ([] if t.id in in_ci else ["not in CI"])
        print(f"{t.id:{wid}}  {t.arch_names:{war}}  {t.platform:{wpl}}  {', '.join(notes)}".rstrip())
    print(f"(this host: {here}. CI builds each single-arch target that can build, and the several-arch builds "
          "forge.toml lists by their '+' id, on the platforms it has runners for; `kforge plan TARGET` says what a "
          "build will do)")
