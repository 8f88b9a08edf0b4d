"""The sm_90a paths of kforge_fmha, parsed from the one table, csrc/fmha_paths.def, for
tests/test_gpu.py and scripts/tma_smoke.py (no torch and no library needed: the tests are
parametrized from it before the library loads). The kernels a path runs come from the library
(kforge_fmha.path_kernel, default_path, path_built: the same table, compiled in);
tests/test_cpu.py checks that the library, the Python package and the README agree with this
parse."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PATHS_DEF = Path(__file__).resolve().parent.parent / "csrc" / "fmha_paths.def"

_ROW = re.compile(r"^KFORGE_FMHA_(VAR|PATH|DEFAULT)\((.*)\)\s*$")
_FIELD = re.compile(r'\s*("(?:[^"\\]|\\.)*"|-?\d+)\s*(?:,|$)')


@dataclass(frozen=True)
class Var:
    var: int
    suffix: str
    block_n: int
    no_counter: int
    narrow_of: int
    narrow_max: int


@dataclass(frozen=True)
class Path_:
    name: str
    mode: int
    var64: int
    var128: int
    kv_skew: int
    summary: str

    def var(self, head_dim: int) -> int:
        return self.var64 if head_dim == 64 else self.var128


@dataclass(frozen=True)
class Default:
    head_dim: int
    causal: bool
    max_seqlen_k: int
    path: str


def _fields(text: str) -> list:
    out, pos = [], 0
    while pos < len(text):
        m = _FIELD.match(text, pos)
        if m is None:
            raise ValueError(f"{PATHS_DEF}: cannot read the fields {text!r}")
        tok = m.group(1)
        out.append(tok[1:-1] if tok.startswith('"') else int(tok))
        pos = m.end()
    return out


def parse(text: str | None = None) -> tuple[list[Var], list[Path_], list[Default]]:
    """The VAR, PATH and DEFAULT rows of fmha_paths.def, in order (lines that start with the
    macro name; the #define lines of the header's preamble do not)."""
    if text is None:
        text = PATHS_DEF.read_text()
    vars_, paths, defaults = [], [], []
    for line in text.splitlines():
        m = _ROW.match(line.strip())
        if m is None:
            continue
        kind, f = m.group(1), _fields(m.group(2))
        if kind == "VAR":
            vars_.append(Var(*f))
        elif kind == "PATH":
            paths.append(Path_(*f))
        else:
            defaults.append(Default(f[0], bool(f[1]), f[2], f[3]))
    return vars_, paths, defaults


VARS, PATHS, DEFAULTS = parse()
ALL_PATHS = [p.name for p in PATHS]
TMA_PATHS = [p.name for p in PATHS if p.mode >= 0]


def lean_kernels() -> set[tuple[int, bool, int, int]]:
    """(head_dim, causal, mode, var) of every TMA kernel the shipped build compiles: the kernels
    of the paths the DEFAULT rows name, their NO_COUNTER kernels and (mode 1, non-causal) their
    narrow variants. Written apart from fmha_paths.h's kernel_built, to check it."""
    by_name = {p.name: p for p in PATHS}
    out = set()
    for d in DEFAULTS:
        p = by_name[d.path]
        var = p.var(d.head_dim)
        out.add((d.head_dim, d.causal, p.mode, var))
        for v in VARS:
            if v.var == var and v.no_counter >= 0:
                out.add((d.head_dim, d.causal, p.mode, v.no_counter))
            if v.narrow_of == var and p.mode == 1 and not d.causal:
                out.add((d.head_dim, d.causal, p.mode, v.var))
    return out


def tuning_kernels() -> set[tuple[int, bool, int, int]]:
    """Every TMA kernel a build with KFORGE_FMHA_TUNING_PATHS compiles: every path's, with their
    NO_COUNTER kernels and narrow variants."""
    out = set()
    for p in PATHS:
        if p.mode < 0:
            continue
        for hd in (64, 128):
            for causal in (False, True):
                var = p.var(hd)
                out.add((hd, causal, p.mode, var))
                for v in VARS:
                    if v.var == var and v.no_counter >= 0:
                        out.add((hd, causal, p.mode, v.no_counter))
                    if v.narrow_of == var and p.mode == 1 and not causal:
                        out.add((hd, causal, p.mode, v.var))
    return out


def lean_path_built(path: str, head_dim: int, causal: bool) -> bool:
    """Whether a shipped (lean) build can run `path` at this head dim and mask."""
    p = next(p for p in PATHS if p.name == path)
    return p.mode < 0 or (head_dim, causal, p.mode, p.var(head_dim)) in lean_kernels()


# --- the README's generated part ---------------------------------------------------------------

README = PATHS_DEF.parent.parent / "README.md"
BEGIN = "<!-- tests/tma_paths.py --write: generated from csrc/fmha_paths.def from here -->"
END = "<!-- tests/tma_paths.py --write: generated up to here -->"
_PREFIX = {0: "sm90_tma_basic", 1: "sm90_tma_overlap", 2: "sm90_tma"}


def kernel_name(mode: int, var: int) -> str:
    """The name kforge_fmha_last_kernel gives TMA kernel (mode, var): written apart from
    fmha_api.cpp's tma_kernel_name, to check it."""
    return _PREFIX[mode] + next(v.suffix for v in VARS if v.var == var)


def default_path(head_dim: int, causal: bool, seqlen_k: int) -> str:
    """The DEFAULT rows' pick, read apart from the library's, to check it."""
    for d in DEFAULTS:
        if d.head_dim == head_dim and d.causal == causal and (d.max_seqlen_k == 0 or seqlen_k <= d.max_seqlen_k):
            return d.path
    raise ValueError(f"no DEFAULT row for head dim {head_dim}, causal={causal}")


def readme_block() -> str:
    """The default rule and the path table, as the README shows them (between BEGIN and END)."""
    cols = [(2048, "seqlen_k ≤ 2048"), (4096, "≤ 4096"), (8192, "≤ 8192"), (8193, "> 8192")]
    lines = [BEGIN, "", "| head dim | mask | " + " | ".join(c for _, c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for hd in (64, 128):
        for causal in (False, True):
            picks = " | ".join(f"`{default_path(hd, causal, sk)}`" for sk, _ in cols)
            lines.append(f"| {hd} | {'causal' if causal else 'non-causal'} | {picks} |")
    lines += ["", "| path | kernel at hdim 64 | kernel at hdim 128 | in the shipped build | what |",
              "|---|---|---|---|---|"]
    for p in PATHS:
        if p.mode < 0:
            k64, k128, ship = ("per shape", "per shape", "yes") if p.name == "default" else \
                ("`mma_sync`", "`sm90_wgmma`", "yes")
        else:
            k64, k128 = (f"`{kernel_name(p.mode, p.var(hd))}`" for hd in (64, 128))
            where = [f"{hd} {'causal' if c else 'non-causal'}" for hd in (64, 128) for c in (False, True)
                     if lean_path_built(p.name, hd, c)]
            ship = ", ".join(where) if where else "no (tuning)"
        lines.append(f"| `{p.name}` | {k64} | {k128} | {ship} | {p.summary} |")
    lines += ["", f"The shipped build compiles {len(lean_kernels())} TMA kernels per dtype; with "
              f"`KFORGE_FMHA_TUNING_PATHS` on, {len(tuning_kernels())}.", "", END]
    return "\n".join(lines)


def readme_with_block(text: str) -> str:
    """`text` (the README) with its generated block replaced by readme_block()."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + readme_block() + text[end:]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        print("usage: python kernels/fmha/tests/tma_paths.py --write   (regenerates README.md's path "
              "tables from csrc/fmha_paths.def)", file=sys.stderr)
        sys.exit(2)
    README.write_text(readme_with_block(README.read_text()))
