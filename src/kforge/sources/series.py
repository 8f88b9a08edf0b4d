"""The patch series format and a reader for ``git format-patch`` files.

``patches/<project>/series`` lists patches in the order they apply, one per line::

    # comments and blank lines are ignored
    0001-setup-accept-more-archs.patch
    0002-setup-msvc-flags.patch      platform=windows
    0003-sm120-gencode.patch         arch>=sm_120   upstream>=2.8,<3

Each condition is ``key OP value``; all conditions of an entry must hold.

* ``platform=linux,windows`` / ``platform!=windows`` (the build's platform; ``windows`` matches
  ``windows-amd64``, ``linux`` matches ``linux-x86_64`` and ``linux-aarch64``)
* ``arch=sm_120a`` / ``arch=sm_120`` (any suffix) / ``arch>=sm_100`` / ``arch!=sm_90a``:
  holds if *any* arch of the build matches (``!=``: if none does)
* ``upstream>=2.8.3`` / ``upstream==2.8.*`` / ``upstream<2.9,>=2.8``: a PEP 440 specifier on
  the upstream version the project pins
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kforge.cuda.arch import Arch, parse_arch
from kforge.errors import KforgeError, PatchError, decode_utf8, did_you_mean
from kforge.fsutil import sha256_file

KEYS = ("platform", "arch", "upstream")
_COND = re.compile(r"^(?P<key>[a-z_]+)(?P<op>==|=|!=|>=|<=|>|<)(?P<value>.+)$")


@dataclass(frozen=True)
class PatchContext:
    """What a build looks like, to select conditional entries."""

    platform: str  # a forge.toml platform name ("linux-x86_64") or an OS ("windows")
    archs: tuple[Arch | str, ...] = ()  # the build's archs: Arch, or any spelling ("sm_120a", "120")
    upstream_version: str | None = None


def _arch(value: Arch | str) -> Arch:
    """An arch of a condition or a context, through kforge's one arch table (every spelling it takes)."""
    if isinstance(value, Arch):
        return value
    try:
        return parse_arch(value)
    except KforgeError as exc:
        raise PatchError(f"'{value.strip()}' is not an arch: {exc.what}", fix=exc.fix or "write archs like sm_90a, sm_120 or 12.0a") from None


@dataclass(frozen=True)
class Condition:
    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    def holds(self, ctx: PatchContext) -> bool:
        if self.key == "platform":
            plat = ctx.platform.lower()
            hit = any(plat == v or plat.startswith(v + "-") for v in (x.strip().lower() for x in self.value.split(",")))
            return hit == (self.op in ("=", "=="))
        if self.key == "arch":
            return self._arch_holds(ctx)
        if ctx.upstream_version is None:
            raise PatchError(
                f"series entry condition '{self}' needs the upstream version, which is unknown",
                fix="set upstream_version for the project in forge.toml, or pass --upstream-version",
            )
        try:
            version = Version(ctx.upstream_version)
        except InvalidVersion:
            raise PatchError(f"upstream version '{ctx.upstream_version}' is not a PEP 440 version",
                             fix="fix upstream_version in forge.toml (e.g. 2.8.3.post2)") from None
        return version in SpecifierSet(self._specifier())

    def _arch_holds(self, ctx: PatchContext) -> bool:
        archs = [_arch(a) for a in ctx.archs]
        if self.op in ("=", "==", "!="):
            wanted = [_arch(v) for v in self.value.split(",")]
            any_match = any(a.number == w.number and (not w.variant or a.variant == w.variant) for a in archs for w in wanted)
            return any_match if self.op != "!=" else not any_match
        num = _arch(self.value).number
        cmp = {">=": int.__ge__, "<=": int.__le__, ">": int.__gt__, "<": int.__lt__}[self.op]
        return any(cmp(a.number, num) for a in archs)

    def _specifier(self) -> str:
        parts = [p.strip() for p in self.value.split(",")]
        first = ("==" if self.op == "=" else self.op) + parts[0]
        return ",".join([first, *parts[1:]])

    def validate(self, where: str) -> None:
        try:
            if self.key == "arch":
                for v in self.value.split(","):
                    try:
                        _arch(v)
                    except PatchError as exc:
                        raise PatchError(f"{where}: '{self}': {exc.what}", fix=exc.fix) from None
                if self.op not in ("=", "==", "!=") and "," in self.value:
                    raise PatchError(f"{where}: '{self}' compares with a list", fix="use one arch with >=, <=, >, <")
            elif self.key == "upstream":
                SpecifierSet(self._specifier())
            elif self.op not in ("=", "==", "!="):
                raise PatchError(f"{where}: '{self}': platform takes only = or !=", fix="e.g. platform=windows")
        except InvalidSpecifier as exc:
            raise PatchError(f"{where}: '{self}' is not a version condition", why=str(exc),
                             fix="e.g. upstream>=2.8.3 or upstream==2.8.*") from exc


@dataclass(frozen=True)
class SeriesEntry:
    name: str  # file name, relative to the series directory
    path: Path
    conditions: tuple[Condition, ...] = ()
    line: int = 0

    def applies_to(self, ctx: PatchContext) -> bool:
        return all(c.holds(ctx) for c in self.conditions)

    def unmet(self, ctx: PatchContext) -> tuple[Condition, ...]:
        return tuple(c for c in self.conditions if not c.holds(ctx))

    @property
    def condition_text(self) -> str:
        return " ".join(str(c) for c in self.conditions)


@dataclass(frozen=True)
class Series:
    directory: Path
    entries: tuple[SeriesEntry, ...] = ()
    header: tuple[str, ...] = field(default=(), compare=False)  # leading comment lines, kept by refresh

    def select(self, ctx: PatchContext) -> tuple[SeriesEntry, ...]:
        return tuple(e for e in self.entries if e.applies_to(ctx))


def load_series(directory: Path | None) -> Series:
    """Read ``<directory>/series``. No directory, or no series file, is an empty series."""
    if directory is None:
        return Series(Path("."), ())
    directory = Path(directory)
    series_file = directory / "series"
    if not series_file.is_file():
        if directory.is_dir() and any(directory.glob("*.patch")):
            raise PatchError(f"{directory} has .patch files but no series file",
                             fix=f"list the patches, in order, in {series_file}")
        return Series(directory, ())
    entries: list[SeriesEntry] = []
    header: list[str] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(decode_utf8(series_file.read_bytes(), series_file).splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            if not entries and raw.strip().startswith("#"):
                header.append(raw.rstrip())
            continue
        name, *tokens = line.split()
        where = f"{series_file}:{lineno}"
        conds = tuple(_parse_condition(t, where) for t in tokens)
        path = directory / name
        if name in seen:
            raise PatchError(f"{where}: {name} is listed twice", fix="list each patch once")
        if not path.is_file():
            raise PatchError(f"{where}: {name} does not exist", fix=f"add {path} or remove the line")
        seen.add(name)
        entries.append(SeriesEntry(name, path, conds, lineno))
    return Series(directory, tuple(entries), tuple(header))


def _parse_condition(token: str, where: str) -> Condition:
    m = _COND.match(token)
    if not m:
        raise PatchError(f"{where}: cannot read condition '{token}'",
                         fix="write conditions as key=value, e.g. platform=windows, arch>=sm_120, upstream<2.9")
    if m["key"] not in KEYS:
        raise PatchError(f"{where}: unknown condition key '{m['key']}'{did_you_mean(m['key'], KEYS)}",
                         fix=f"use one of {', '.join(KEYS)}")
    cond = Condition(m["key"], m["op"], m["value"])
    cond.validate(where)
    return cond


def series_hash(series: Series, ctx: PatchContext | None = None) -> str:
    """sha256 identifying the patches a build applies (with ``ctx``) or the whole series.

    Covers each selected patch's name and bytes, in order; without ``ctx`` also the conditions.
    """
    h = hashlib.sha256()
    entries = series.select(ctx) if ctx is not None else series.entries
    for e in entries:
        h.update(e.name.encode() + b"\0")
        if ctx is None:
            h.update(e.condition_text.encode() + b"\0")
        h.update(bytes.fromhex(sha256_file(e.path)))
    return h.hexdigest()


# --------------------------------------------------------------------------- patch files


@dataclass(frozen=True)
class Hunk:
    index: int  # 1-based within its file
    header: str  # the "@@ -a,b +c,d @@ ..." line
    old_start: int
    old: tuple[str, ...]  # lines the patch expects (context + removed)
    new: tuple[str, ...]  # lines after the patch (context + added)


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"


@dataclass(frozen=True)
class ParsedPatch:
    subject: str
    files: tuple[FilePatch, ...]

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(p for f in self.files for p in (f.old_path, f.new_path) if p)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_patch(path: Path) -> ParsedPatch:
    """Read a ``git format-patch`` (or plain ``git diff``) file into files and hunks."""
    lines = decode_utf8(path.read_bytes(), path).split("\n")
    subject = next((ln[len("Subject: "):] for ln in lines if ln.startswith("Subject: ")), path.stem)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    files: list[FilePatch] = []
    i = 0
    old_path = new_path = None
    hunks: list[Hunk] = []
    in_file = False

    def flush() -> None:
        if in_file:
            files.append(FilePatch(old_path, new_path, tuple(hunks)))

    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            flush()
            in_file, hunks = True, []
            m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
            old_path = new_path = m.group(2) if m else None
            if m:
                old_path = m.group(1)
        elif in_file and line.startswith("--- "):
            old_path = None if line[4:].strip() == "/dev/null" else _strip(line[4:])
        elif in_file and line.startswith("+++ "):
            new_path = None if line[4:].strip() == "/dev/null" else _strip(line[4:])
        elif in_file and line.startswith("new file mode"):
            old_path = None
        elif in_file and line.startswith("deleted file mode"):
            new_path = None
        elif in_file and (m := _HUNK.match(line)):
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            old, new = [], []
            j = i + 1
            while (len(old) < old_n or len(new) < new_n) and j < len(lines):
                body = lines[j]
                tag, text = (body[:1], body[1:]) if body else (" ", "")
                if tag in (" ", "-"):
                    old.append(text)
                if tag in (" ", "+"):
                    new.append(text)
                j += 1
            hunks.append(Hunk(len(hunks) + 1, line, int(m.group(1)), tuple(old), tuple(new)))
            i = j
            continue
        i += 1
    flush()
    if not files:
        raise PatchError(f"{path.name} contains no diff", fix="generate patches with `git format-patch`")
    for f in files:
        for p in (f.old_path, f.new_path):
            if p and (p.startswith("/") or ".." in p.split("/") or re.match(r"^[A-Za-z]:", p)):
                raise PatchError(f"{path.name} touches a path outside the tree: {p}",
                                 fix="patches may only change files inside the upstream source")
    return ParsedPatch(subject, tuple(files))


def _strip(p: str) -> str:
    p = p.strip().split("\t")[0]
    return p[2:] if p[:2] in ("a/", "b/") else p
