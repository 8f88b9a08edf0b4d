"""The ninja shim: start the longest compile units first, by reordering ``build.ninja``'s edges from measured times.

Why a shim: ninja starts ready edges in the order it parsed them. ninja >= 1.12 orders its ready
queue by critical path first, but weighs every edge 1 (it does not read ``.ninja_log`` times), so
the compile edges of one library (all on paths of the same length) still start in file order;
a seeded ``.ninja_log`` changes nothing (checked with ninja 1.11.1 and 1.13.2, see
``tests/integration/test_ninjaorder_real.py``). torch's ``BuildExtension`` writes
``build/temp.*/build.ninja`` with one edge per source in setup.py's order and runs
``ninja -v -j N`` from ``PATH``; CMake's Ninja generator runs the ninja it found on ``PATH``.
kforge puts a ``ninja`` script first on ``PATH`` that runs :func:`main` here: it reorders the build
file in place, then execs the real ninja with the same arguments.

What changes and what does not: only the order of ``build`` statements *within* a run of
consecutive ``build`` statements (no variable, rule, pool, include or default line between them,
so every edge in a run sees the same bindings), sorted by measured seconds, longest first; edges
with no measured time get the median (stable, so with nothing measured the file is untouched).
Every edge, command and variable stays byte for byte the same (:func:`reorder` checks it). The
mtime of the file is kept. Tools (``-t``), ``--version``, ``-h`` and a missing build file pass
through; any error in the reordering leaves the file as it was and runs ninja anyway.

This module imports only the standard library: it runs as a script (``python -I ninjaorder.py``),
also inside a build that cannot import kforge.
"""

from __future__ import annotations

import fnmatch
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: How many trailing path components name a unit (``flash_attn/src/flash_fwd_hdim128_bf16_sm80.o``).
KEY_PARTS = 4


def unit_key(path: str) -> str:
    """The last :data:`KEY_PARTS` components of an output path, ``/``-separated: stable across scratch trees."""
    parts = [p for p in path.replace("\\", "/").split("/") if p and p != "."]
    return "/".join(parts[-KEY_PARTS:])


@dataclass(frozen=True)
class Block:
    """One chunk of the build file: a ``build`` statement with its indented lines, or anything else."""

    text: str  # the lines, each with its newline
    output: str | None  # first explicit output of a build statement, unescaped; None for other chunks


def _logical_lines(text: str) -> list[str]:
    """Physical lines joined where a line ends in an unescaped ``$`` (ninja's continuation)."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines(keepends=True):
        pending += line
        body = line.rstrip("\r\n")
        trailing = len(body) - len(body.rstrip("$"))
        if trailing % 2 == 1 and line.endswith("\n"):
            continue
        out.append(pending)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _first_output(statement: str) -> str | None:
    """The first output of ``build out1 out2 | imp: rule ins`` with ninja's ``$`` escapes undone."""
    rest = statement[len("build"):].lstrip(" ")
    word: list[str] = []
    i = 0
    while i < len(rest):
        c = rest[i]
        if c == "$" and i + 1 < len(rest):
            nxt = rest[i + 1]
            if nxt in " :$":
                word.append(nxt)
                i += 2
                continue
            if nxt == "\n" or rest[i + 1:i + 3] == "\r\n":
                break
            word.append(c)
            i += 1
            continue
        if c in " :|\r\n":
            break
        word.append(c)
        i += 1
    return "".join(word) or None


def parse(text: str) -> list[Block]:
    """The build file as blocks; ``"".join(b.text for b in parse(t)) == t``."""
    blocks: list[Block] = []
    current: list[str] = []
    output: str | None = None
    kind = "other"

    def flush() -> None:
        nonlocal current
        if current:
            blocks.append(Block("".join(current), output if kind == "build" else None))
            current = []

    for line in _logical_lines(text):
        stripped = line.strip()
        if line.startswith("build ") or line.startswith("build\t"):
            flush()
            kind, output = "build", _first_output(line)
            current = [line]
        elif kind == "build" and (line[:1] in (" ", "\t") or not stripped or stripped.startswith("#")):
            current.append(line)  # the statement's own bindings, and blank/comment lines after it
        else:
            flush()
            kind, output = "other", None
            current = [line]
    flush()
    return blocks


def reorder(text: str, seconds: Callable[[str], float | None]) -> tuple[str, int, int]:
    """``text`` with each run of consecutive build statements sorted longest first.

    Returns (new text, edges with a measured time, edges that moved). With no edge measured the
    text comes back unchanged. Raises ``ValueError`` if the result would not hold exactly the same
    statements (it cannot, by construction; the check keeps it that way).
    """
    blocks = parse(text)
    times = {i: seconds(b.output) for i, b in enumerate(blocks) if b.output is not None}
    known = [t for t in times.values() if t is not None]
    if not known:
        return text, 0, 0
    fill = statistics.median(known)
    out: list[Block] = []
    run: list[tuple[int, Block]] = []

    def close_run() -> None:
        # a statement that does not end in a newline (the file's last line) gets one only if it moves
        ordered = sorted(run, key=lambda ib: -(times[ib[0]] if times[ib[0]] is not None else fill))
        out.extend(b for _, b in ordered)
        run.clear()

    for i, block in enumerate(blocks):
        if block.output is not None:
            if not block.text.endswith("\n"):
                block = Block(block.text + "\n", block.output)
            run.append((i, block))
        else:
            close_run()
            out.append(block)
    close_run()
    new = "".join(b.text for b in out)
    if sorted(b.text.rstrip("\n") for b in parse(new)) != sorted(b.text.rstrip("\n") for b in blocks):
        raise ValueError("reordering changed the build statements")
    moved = sum(1 for a, b in zip(blocks, out, strict=True) if a.text.rstrip("\n") != b.text.rstrip("\n"))
    return (text if moved == 0 else new), len(known), moved


# ---------------------------------------------------------------------------- measured times


@dataclass(frozen=True)
class UnitTimes:
    """Measured seconds per unit key; looked up by the longest unique trailing path."""

    seconds: Mapping[str, float]

    def lookup(self, output: str) -> float | None:
        """The unit's seconds: by the longest unique path tail, else by the first file-name glob (a seed's kind)."""
        key = unit_key(output)
        if key in self.seconds:
            return self.seconds[key]
        parts = key.split("/")
        exact = {k: s for k, s in self.seconds.items() if not _is_glob(k)}
        for n in range(len(parts) - 1, 0, -1):
            tail = "/".join(parts[-n:])
            hits = [s for k, s in exact.items() if k == tail or k.endswith("/" + tail)]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                return None  # ambiguous: leave the edge at the median
        name = parts[-1] if parts else ""
        for k, s in self.seconds.items():
            if _is_glob(k) and fnmatch.fnmatchcase(name, k):
                return s
        return None


def _is_glob(key: str) -> bool:
    return any(c in key for c in "*?[")


# ---------------------------------------------------------------------------- the shim's entry point


def build_file(args: Sequence[str]) -> str | None:
    """The build file a ninja command line reads, or None when it runs a tool / prints and exits."""
    directory, name = ".", "build.ninja"
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--version", "-h", "--help") or a == "-t" or a.startswith("-t"):
            return None
        if a == "-C" and i + 1 < len(args):
            directory = os.path.join(directory, args[i + 1])
            i += 2
            continue
        if a.startswith("-C") and len(a) > 2:
            directory = os.path.join(directory, a[2:])
        elif a == "-f" and i + 1 < len(args):
            name = args[i + 1]
            i += 2
            continue
        elif a.startswith("-f") and len(a) > 2:
            name = a[2:]
        elif a in ("-j", "-k", "-l", "-d", "-w") and i + 1 < len(args):
            i += 2
            continue
        i += 1
    return os.path.join(directory, name)


def apply(path: str, times: UnitTimes) -> tuple[int, int]:
    """Reorder the build file at ``path`` in place (atomically, mtime kept); (measured, moved)."""
    with open(path, encoding="utf-8", newline="") as fh:
        text = fh.read()
    new, measured, moved = reorder(text, times.lookup)
    if moved:
        st = os.stat(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".build.ninja.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(new)
            os.chmod(tmp, st.st_mode & 0o7777)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return measured, moved


def main(argv: Sequence[str] | None = None) -> int:
    """``<config.json> <ninja args...>``: reorder the build file, log what moved, exec the real ninja."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("kforge ninja shim: no configuration given (this script is written by kforge)\n")
        return 2
    try:
        with open(args[0], encoding="utf-8") as fh:
            config = json.load(fh)
        if not isinstance(config, dict) or not isinstance(config.get("ninja"), str):
            raise ValueError("no 'ninja' entry")
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"kforge ninja shim: cannot read its configuration {args[0]} ({exc}); it names the real "
                         "ninja, so nothing can run. Rebuild with kforge (it rewrites the shim), or take the shim's "
                         "folder off PATH.\n")
        return 2
    ninja_args = args[1:]
    path = build_file(ninja_args)
    if path is not None and os.path.isfile(path) and config.get("seconds"):
        try:
            measured, moved = apply(path, UnitTimes(dict(config["seconds"])))
            line = {"file": os.path.abspath(path), "measured": measured, "moved": moved}
        except (OSError, ValueError, UnicodeError) as exc:
            line = {"file": os.path.abspath(path), "error": str(exc)}
            sys.stderr.write(f"kforge ninja shim: left {path} in its own order: {exc}\n")
        if config.get("log"):
            try:
                with open(config["log"], "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line) + "\n")
            except OSError:
                pass
    ninja = config["ninja"]
    sys.stdout.flush()
    try:
        os.execv(ninja, [ninja, *ninja_args])
    except OSError as exc:
        sys.stderr.write(f"kforge ninja shim: cannot run {ninja}: {exc}\n")
        return 127
    return 0  # pragma: no cover (exec does not return)


if __name__ == "__main__":
    sys.exit(main())
