"""``kforge matrix``: every declared target with what has really been built of it (docs/verified/records.toml)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kforge.build.host import platform_name
from kforge.commands._common import forge_from_args
from kforge.errors import ConfigError
from kforge.fsutil import atomic_write_text
from kforge.verified.matrix import build_rows
from kforge.verified.records import RECORDS_FILE, load_runs, load_unfit, reference_platform
from kforge.verified.render import DOC_FILE, as_json, markdown, replace_section, summary, text_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("matrix", help="every target with what has really been built of it (GPU-tested, built, planned)")
    p.add_argument("--project", action="append", help="only these projects (the table and --json)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the rows with their runs as JSON")
    out.add_argument(
        "--markdown",
        action="store_true",
        help=f"write the matrix section of {DOC_FILE} (between its marker lines) from the records",
    )
    out.add_argument(
        "--check",
        action="store_true",
        help=f"fail when the matrix section of {DOC_FILE} differs from what --markdown writes",
    )
    p.add_argument("--records", default=None, help=f"the records file (default: {RECORDS_FILE} under the root)")
    p.add_argument("--doc", default=None, help=f"the page --markdown and --check use (default: {DOC_FILE})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    forge = forge_from_args(args)
    for name in args.project or ():
        forge.project(name)  # an unknown name is an error with a did-you-mean
    records = Path(args.records).resolve() if args.records else None
    runs = load_runs(forge, records)
    unfit = load_unfit(forge, records)
    if args.markdown or args.check:
        here = reference_platform(forge)  # the page reads the same on every host
        doc = Path(args.doc).resolve() if args.doc else forge.root / DOC_FILE
        rows = build_rows(forge, runs, here, unfit)
        try:
            page = doc.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot read {doc}: {exc.strerror}", fix="pass --doc PATH, or run in a kforge checkout"
            ) from None
        new = replace_section(page, markdown(rows, here), doc.name)
        if args.check:
            if new != page:
                raise ConfigError(
                    f"the matrix section of {doc} is not what the records give",
                    why=f"{RECORDS_FILE} or forge.toml changed after the page was written",
                    fix="run `kforge matrix --markdown` and commit the page",
                )
            print(f"{doc.name}: the matrix section is current ({summary(rows)})")
        elif new == page:
            print(f"{doc.name}: the matrix section was current ({summary(rows)})")
        else:
            atomic_write_text(doc, new)
            print(f"{doc.name}: wrote the matrix section ({summary(rows)})")
        return 0
    rows = tuple(
        r for r in build_rows(forge, runs, platform_name(), unfit) if not args.project or r.target.project in args.project
    )
    print(json.dumps(as_json(rows), indent=2) if args.json else text_table(rows))
    return 0
