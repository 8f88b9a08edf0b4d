"""``kforge wheelhouse index|list|clean``: the published wheels and their PEP 503 index."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kforge import wheelhouse
from kforge.commands._common import forge_from_args, wheelhouse_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("wheelhouse", help="the wheelhouse: rebuild its index, list or remove wheels")
    p.add_argument("--wheelhouse", type=Path,
                   help="the wheelhouse folder (default: $KFORGE_WHEELHOUSE, else <root>/wheelhouse)")
    verbs = p.add_subparsers(dest="wheelhouse_command", metavar="VERB", required=True)
    verbs.add_parser("index", help="regenerate simple/ (PEP 503) from the complete wheels").set_defaults(func=run_index)
    ls = verbs.add_parser("list", help="published wheels with sha256, size, target and build time")
    ls.add_argument("project", nargs="?", help="only this project")
    ls.add_argument("--json", action="store_true", help="the manifests as JSON")
    ls.set_defaults(func=run_list)
    cl = verbs.add_parser("clean", help="remove published wheels (and regenerate the index)")
    cl.add_argument("project", nargs="?", help="only this project (default: every project)")
    cl.set_defaults(func=run_clean)


def run_index(args: argparse.Namespace) -> int:
    root = wheelhouse_root(args)
    index = wheelhouse.rebuild_index(root)
    count = len(wheelhouse.list_wheels(root))
    print(f"{index} ({count} wheels); pip install --index-url {index.parent.as_uri()}/ <name>")
    return 0


def run_list(args: argparse.Namespace) -> int:
    if args.project:
        forge_from_args(args).project(args.project)  # an unknown name gets a did-you-mean, not "no wheels"
    wheels = wheelhouse.list_wheels(wheelhouse_root(args), args.project)
    if args.json:
        print(json.dumps([json.loads(w.record.to_json()) for w in wheels], indent=2))
        return 0
    if not wheels:
        print("no wheels" + (f" for {args.project}" if args.project else ""))
        return 0
    rows = [("project", "wheel", "target", "size", "sha256", "built", "doctor")]
    for w in wheels:
        m = w.record
        doctor = "-" if m.doctor is None else ("ok" if m.doctor.get("ok", True) else "FAILED")
        rows.append((w.project, w.filename, m.target, f"{m.size / 1e6:.1f} MB", m.sha256[:12], m.built_at or "-", doctor))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip())
    return 0


def run_clean(args: argparse.Namespace) -> int:
    removed = wheelhouse.clean(wheelhouse_root(args), args.project)
    print(f"removed {removed} wheel(s)" + (f" of {args.project}" if args.project else ""))
    return 0
