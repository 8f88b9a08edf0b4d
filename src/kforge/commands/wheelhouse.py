"""``kforge wheelhouse index|list|verify|merge|clean``: the published wheels and their PEP 503 index."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kforge.commands._common import forge_from_args, wheelhouse_root
from kforge.errors import PublishError
from kforge.wheels import merge as wheelmerge
from kforge.wheels import wheelhouse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("wheelhouse", help="the wheelhouse: index, list, verify, merge or remove wheels")
    p.add_argument("--wheelhouse", type=Path,
                   help="the wheelhouse folder (default: $KFORGE_WHEELHOUSE, else <root>/wheelhouse)")
    p.add_argument("--no-wait", action="store_true", help="fail at once if another kforge process holds the wheelhouse")
    verbs = p.add_subparsers(dest="wheelhouse_command", metavar="VERB", required=True)
    verbs.add_parser("index", help="regenerate simple/ and the per-CUDA cuXYZ/simple/ (PEP 503 HTML + PEP 691 JSON) from the verified wheels; fix file modes") \
        .set_defaults(func=run_index)
    ls = verbs.add_parser("list", help="published wheels with sha256, size, target and build time")
    ls.add_argument("project", nargs="?", help="only this project")
    ls.add_argument("--json", action="store_true", help="the manifests as JSON")
    ls.set_defaults(func=run_list)
    ve = verbs.add_parser("verify", help="check every wheel, manifest, index page, hash and file mode; "
                                         "exit 11 on any drift")
    ve.set_defaults(func=run_verify)
    me = verbs.add_parser("merge", help="merge per-job wheelhouses into this one (atomic; refuses conflicting sha256s)")
    me.add_argument("sources", nargs="+", type=Path, metavar="DIR", help="wheelhouse folders to merge in")
    me.add_argument("--replace", action="store_true",
                    help="let a merged wheel replace one of the same file name and other contents")
    me.set_defaults(func=run_merge)
    cl = verbs.add_parser("clean", help="remove published wheels (and regenerate the index)")
    cl.add_argument("project", nargs="?", help="only this project (default: every project)")
    cl.set_defaults(func=run_clean)


def _problems_error(root: Path, problems: tuple[wheelhouse.Problem, ...], done: str) -> PublishError:
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return PublishError(f"{done}, and {len(problems)} problem(s) in the wheelhouse {root} (listed above)",
                        why="the index lists only wheels whose manifest agrees with them",
                        fix="fix each one as its line says, then run kforge wheelhouse verify")


def run_index(args: argparse.Namespace) -> int:
    root = wheelhouse_root(args)
    result = wheelhouse.rebuild_index(root, wait=not args.no_wait)
    index = root / wheelhouse.INDEX_DIR / "index.html"
    print(f"{index} ({len(result.wheels)} wheels); pip install --index-url {index.parent.as_uri()}/ <name>")
    if result.problems:
        raise _problems_error(root, result.problems, f"the index lists {len(result.wheels)} wheel(s)")
    return 0


def run_list(args: argparse.Namespace) -> int:
    if args.project:
        forge_from_args(args).project(args.project)  # an unknown name gets a did-you-mean, not "no wheels"
    root = wheelhouse_root(args)
    result = wheelhouse.scan(root, args.project)
    wheels = result.wheels
    if args.json:
        print(json.dumps([json.loads(w.record.to_json()) for w in wheels], indent=2))
    elif not wheels:
        print("no wheels" + (f" for {args.project}" if args.project else ""))
    else:
        rows = [("project", "wheel", "target", "size", "sha256", "built", "doctor")]
        for w in wheels:
            m = w.record
            doctor = "-" if m.doctor is None else ("ok" if m.doctor.get("ok", True) else "FAILED")
            rows.append((w.project, w.filename, m.target, f"{m.size / 1e6:.1f} MB", m.sha256[:12], m.built_at or "-",
                         doctor))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip())
    if result.problems:
        raise _problems_error(root, result.problems, f"{len(wheels)} wheel(s) listed")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    root = wheelhouse_root(args)
    result = wheelhouse.verify(root)
    if result.problems:
        raise _problems_error(root, result.problems, f"{len(result.wheels)} wheel(s) verified")
    print(f"{root}: {len(result.wheels)} wheel(s), manifests, index and modes verified")
    return 0


def run_merge(args: argparse.Namespace) -> int:
    root = wheelhouse_root(args)
    result = wheelmerge.merge(root, args.sources, replace=args.replace, wait=not args.no_wait)
    for key in result.added:
        print(f"added     {key}")
    for key in result.replaced:
        print(f"replaced  {key}")
    for key in result.unchanged:
        print(f"unchanged {key}")
    print(f"{result.index}: merged {len(args.sources)} wheelhouse(s); pip install --index-url "
          f"{result.index.parent.as_uri()}/ <name>")
    return 0


def run_clean(args: argparse.Namespace) -> int:
    removed = wheelhouse.clean(wheelhouse_root(args), args.project, wait=not args.no_wait)
    print(f"removed {removed} wheel(s)" + (f" of {args.project}" if args.project else ""))
    return 0
