"""Show a doctor report: a rich table by arch for people, JSON for manifests and scripts."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from kforge.cuda.arch import PTX, SASS, Arch
from kforge.doctor.model import BinaryReport, Finding, WheelReport

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_text(report: WheelReport | BinaryReport | Sequence[WheelReport | BinaryReport], findings: Sequence[Finding] = (), *, width: int = 120) -> str:
    """A table per wheel (rows: binaries, columns: archs; cells say SASS/PTX, ``z`` = compressed), then
    each binary's libraries, symbols and largest sections, then the findings."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None, highlight=False)
    reports = _as_list(report)
    for rep in reports:
        if isinstance(rep, WheelReport):
            console.print(f"[bold]{rep.filename}[/bold]  {rep.size / 1e6:.2f} MB  sha256 {rep.sha256[:16]}…")
            binaries = rep.binaries
        else:
            binaries = (rep,)
        cuda = [b for b in binaries if b.is_cuda]
        if cuda:
            console.print(_arch_table(cuda))
            console.print(LEGEND)
        elif binaries:
            console.print("no CUDA device code in any binary")
        else:
            console.print("no ELF or PE binaries")
        for b in binaries:
            console.print(f"[bold]{b.path}[/bold] ({b.format}, {b.size / 1e6:.2f} MB, {b.containers} fatbin container(s))")
            console.print(f"  needs: {', '.join(b.needed) or '-'}")
            flagged = b.linked_binary_symbols
            console.print(f"  undefined symbols: {len(b.undefined_symbols)}" + (f", unresolved device link: {', '.join(flagged)}" if flagged else ""))
            for line in _kernel_lines(b):
                console.print(line)
            top = sorted(b.sections, key=lambda s: s.size, reverse=True)[:6]
            console.print("  largest sections: " + ", ".join(f"{s.name} {_human(s.size)}" for s in top))
    for f in findings:
        console.print(f"[{STYLE.get(f.severity, '')}]{f.severity}[/]: {f.message}")
    return buf.getvalue()


#: What the arch table's cells mean, printed under it.
LEGEND = ("  SASS: machine code for that arch; PTX: portable code the driver compiles for newer GPUs;\n"
          "  z (SASSz, PTXz): stored compressed; (rdc): relocatable, still to be device-linked; -: none")


def _kernel_lines(b: BinaryReport) -> list[str]:
    """One line per SASS arch: how many kernels, and the most registers and shared memory one asks for."""
    lines = []
    order = {e.arch: e.cuda_arch for e in b.fatbins}  # sort the names by their arch (name order as a fallback)
    for arch in sorted({k.arch for k in b.kernels}, key=lambda n: (n not in order, order.get(n, Arch.observed(1, 0)), n)):
        ks = [k for k in b.kernels if k.arch == arch]
        regs = max((k.registers or 0) for k in ks)
        smem = max(k.smem_per_block for k in ks)
        declared = sum(1 for k in ks if k.dynamic_smem is not None)
        lines.append(
            f"  kernels {arch}: {len(ks)}, up to {regs} registers/thread, up to {smem:,} B shared memory/block "
            f"(dynamic declared for {declared}, unknown for {len(ks) - declared})"
        )
    return lines


def _arch_table(binaries: Sequence[BinaryReport]) -> Table:
    columns: set[Arch] = {e.cuda_arch for b in binaries for e in b.fatbins if e.kind in (SASS, PTX)}
    ordered = sorted(columns)
    table = Table(show_lines=False)
    table.add_column("binary")
    for arch in ordered:
        table.add_column(arch.suffixed, justify="center")
    table.add_column("device code")
    for b in binaries:
        cells = []
        for arch in ordered:
            kinds = []
            for kind, label in ((SASS, "SASS"), (PTX, "PTX")):
                entries = [e for e in b.fatbins if e.kind == kind and e.cuda_arch == arch]
                if entries:
                    mark = "z" if any(e.compressed for e in entries) else ""
                    reloc = "(rdc)" if all(e.relocatable for e in entries) else ""
                    kinds.append(label + mark + reloc)
            cells.append("+".join(kinds) or "-")
        stored = sum(e.size for e in b.fatbins)
        table.add_row(b.path, *cells, _human(stored))
    return table


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _as_list(report: Any) -> list[WheelReport | BinaryReport]:
    if isinstance(report, (WheelReport, BinaryReport)):
        return [report]
    return list(report)


def to_dict(report: WheelReport | BinaryReport, findings: Sequence[Finding] | None = None) -> dict[str, Any]:
    if isinstance(report, WheelReport):
        data = dataclasses.asdict(report)
        data.pop("files")
        data["binaries"] = [_binary_dict(b) for b in report.binaries]
    else:
        data = _binary_dict(report)
    if findings is not None:
        data["findings"] = [dataclasses.asdict(f) for f in findings]
        data["ok"] = not any(f.is_error for f in findings)
    return data


def _binary_dict(b: BinaryReport) -> dict[str, Any]:
    data = dataclasses.asdict(b)
    data["sections"] = {s.name: s.size for s in b.sections}
    data["sass_archs"] = list(b.sass_archs)
    data["ptx_archs"] = list(b.ptx_archs)
    data["linked_binary_symbols"] = list(b.linked_binary_symbols)
    return data


def to_json(report: WheelReport | BinaryReport | Sequence[WheelReport | BinaryReport], findings: Sequence[Finding] | None = None, *, indent: int | None = 2) -> str:
    """JSON of one report (an object) or several (a list); ``findings`` are added when given."""
    if isinstance(report, (WheelReport, BinaryReport)):
        return json.dumps(to_dict(report, findings), indent=indent)
    reports = list(report)
    return json.dumps([to_dict(r, [f for f in (findings or ()) if _belongs(f, r)] if findings is not None else None) for r in reports], indent=indent)


def _belongs(finding: Finding, report: WheelReport | BinaryReport) -> bool:
    return isinstance(report, WheelReport) and finding.wheel == report.filename
