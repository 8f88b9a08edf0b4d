"""The matrix as text: a terminal table, JSON, and the generated section of docs/verified.md.

:func:`markdown` is the section between :data:`BEGIN` and :data:`END`; :func:`replace_section` puts it into the
page, leaving every line outside the markers as it was (a page without exactly one pair is refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kforge.errors import ConfigError
from kforge.verified.matrix import ROW_STATUSES, Row, counts
from kforge.verified.records import RECORDS_FILE, STATUSES, Run

__all__ = ["BEGIN", "DOC_FILE", "END", "as_json", "markdown", "replace_section", "summary", "text_table"]

#: The page that holds the generated section, under the monorepo root.
DOC_FILE = "docs/verified.md"
BEGIN = "<!-- kforge matrix --markdown: generated from here (edit docs/verified/records.toml, not this table) -->"
END = "<!-- kforge matrix --markdown: generated up to here -->"

_WORDS = {
    "gpu-tested": "GPU-tested",
    "built-doctor": "built + doctor",
    "planned": "planned only",
    "unbuildable": "unbuildable here",
}


def summary(rows: Sequence[Row]) -> str:
    """``74 rows: 7 GPU-tested, 1 built + doctor, 43 planned only, 23 unbuildable here``."""
    n = counts(rows)
    return f"{len(rows)} rows: " + ", ".join(f"{n[s]} {_WORDS[s]}" for s in ROW_STATUSES)


def evidence(row: Row) -> str:
    """The row's kforge runs in one line: the newest run of its status, how many runs, a newer failure."""
    best = row.best
    parts = [_describe(best)] if best else []
    if row.runs:
        by = {s: sum(r.status == s for r in row.runs) for s in STATUSES}
        tally = ", ".join(f"{n} {s}" for s, n in by.items() if n)
        parts.append(f"{len(row.runs)} run{'s' if len(row.runs) > 1 else ''} ({tally})")
        newest = row.runs[-1]
        if newest.status in ("failed", "stopped") and newest is not best:
            parts.append(f"newest {newest.status}: {_describe(newest)}")
    return "; ".join(parts)


def outside(row: Row) -> str:
    """The runs outside kforge for the row's target: their best status, GPUs, how they built, failures."""
    if not row.outside:
        return ""
    tested = [r for r in row.outside if r.status == "gpu-tested"]
    doctored = [r for r in row.outside if r.status == "built-doctor"]
    if tested:
        head = "GPU-tested on " + ", ".join(dict.fromkeys(d for r in tested for d in r.device))
    else:
        head = "built + doctor" if doctored else ("failed" if any(r.status == "failed" for r in row.outside) else "stopped")
    vias = ", ".join(dict.fromkeys(r.via for r in row.outside))
    failed = sum(r.status == "failed" for r in row.outside)
    n = len(row.outside)
    return f"{head} ({n} record{'s' if n > 1 else ''}, {vias}" + (f"; {failed} with failures" if failed else "") + ")"


def _describe(run: Run) -> str:
    what = run.tests or ("doctor ok" if run.status == "built-doctor" else run.status)
    return f"{run.when}, {', '.join(run.host)}: {what}"


def text_table(rows: Sequence[Row]) -> str:
    """A plain table for the terminal: target, profile, status, then the evidence."""
    wid = max([len("TARGET"), *(len(r.target.id) for r in rows)])
    wpr = max([len("PROFILE"), *(len(r.profile or "-") for r in rows)])
    wst = max([len("STATUS"), *(len(r.label) for r in rows)])
    lines = [f"{'TARGET':{wid}}  {'PROFILE':{wpr}}  {'STATUS':{wst}}  KFORGE RUNS | OUTSIDE KFORGE"]
    for r in rows:
        extra = " | ".join(p for p in (evidence(r), outside(r) and f"outside kforge: {outside(r)}") if p)
        lines.append(f"{r.target.id:{wid}}  {r.profile or '-':{wpr}}  {r.label:{wst}}  {extra}".rstrip())
    return "\n".join([*lines, f"({summary(rows)}; the runs: {RECORDS_FILE})"])


def as_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [
        {
            "id": r.target.id,
            "project": r.target.project,
            "archs": [a.sm for a in r.target.archs],
            "platform": r.target.platform,
            "profile": r.profile,
            "status": r.status,
            "label": r.label,
            "reason": r.reason,
            "unfit": {"host": r.unfit.host, "why": r.unfit.why, "section": r.unfit.section} if r.unfit else None,
            "runs": [_run_json(x) for x in r.runs],
            "outside_kforge": [_run_json(x) for x in r.outside],
        }
        for r in rows
    ]


def _run_json(run: Run) -> dict[str, Any]:
    return {
        "record": run.index,
        "target": run.target.id,
        "profile": run.profile,
        "via": run.via,
        "status": run.status,
        "host": list(run.host),
        "device": list(run.device),
        "date": run.date,
        "time": run.time,
        "wheel_bytes": run.wheel_bytes,
        "tests": run.tests,
        "section": run.section,
        "note": run.note,
    }


def markdown(rows: Sequence[Row], here: str) -> str:
    """The generated section: the counts and one table row per matrix row (``here``: the platform it is seen from)."""
    head = [
        BEGIN,
        "",
        f'{summary(rows)} ("here": a {here} host).',
        "",
        "| target | archs | platform | profile | status | kforge runs (newest of that status) | outside kforge |",
        "|---|---|---|---|---|---|---|",
    ]
    body = [
        f"| `{r.target.id}` | {r.target.arch_names} | {r.target.platform} | {r.profile or '-'} | {_bold(r)} | "
        f"{_cell(evidence(r))} | {_cell(outside(r))} |"
        for r in rows
    ]
    return "\n".join([*head, *body, "", END])


def _bold(row: Row) -> str:
    return f"**{row.label}**" if row.status in ("gpu-tested", "built-doctor") else row.label


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def replace_section(page: str, section: str, name: str = DOC_FILE) -> str:
    """``page`` with the text from :data:`BEGIN` to :data:`END` (both included) replaced by ``section``."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ConfigError(
            f"{name} has no single generated matrix section",
            why=f"`kforge matrix --markdown` replaces only the lines from `{BEGIN}` to `{END}`, and the page holds "
            f"{page.count(BEGIN)} of the first and {page.count(END)} of the second",
            fix="put back one pair of marker lines where the matrix belongs (after the page's intro), then run it again",
        )
    start, stop = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + section + page[stop:]
