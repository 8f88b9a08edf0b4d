"""The patch queue: status, atomic + idempotent apply, revert, check, refresh.

Patches are applied with ``git apply`` (no fuzz, so drift is caught, never papered over)
to a *scratch tree*: an export of a submodule, an unpacked sdist (not a git repository),
or a copy of ``kernels/<name>``. Never to ``externals/`` itself.

* :func:`status` simulates the series on copies of the files it touches and reports, per
  patch, ``applies`` / ``applied`` / ``fails`` / ``skipped``; a failure names the file,
  the hunk, and shows the lines upstream now has where the hunk expected its own.
* :func:`apply` and :func:`revert` are all-or-nothing: every file the series touches is
  backed up first and restored byte for byte if any patch fails (or on Ctrl-C).
* :func:`check_rev` / :func:`check_sdist` answer "does the series still apply to that
  upstream version?" without touching any checkout.
* :func:`refresh` regenerates the series from a branch rebased onto a new pin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kforge.errors import PatchError, SourceError
from kforge.sources import sdist as _sdist
from kforge.sources.series import (
    ParsedPatch,
    PatchContext,
    Series,
    SeriesEntry,
    load_series,
    parse_patch,
    series_hash,
)
from kforge.sources.upstream import has_commit, is_checkout, run_git

__all__ = [
    "PatchContext", "Series", "SeriesEntry", "load_series", "series_hash", "PatchState", "HunkFailure",
    "PatchStatus", "ApplyResult", "CheckReport", "RefreshResult", "status", "apply", "revert", "check_rev",
    "check_sdist", "refresh",
]


class PatchState(str, Enum):
    APPLIES = "applies"  # applies cleanly
    APPLIED = "applied"  # already applied
    FAILS = "fails"
    AMBIGUOUS = "ambiguous"  # applies both forward and in reverse: cannot tell
    SKIPPED = "skipped"  # its conditions do not hold for this build

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class HunkFailure:
    file: str
    hunk: int  # 1-based within the file; 0 when the file itself is the problem
    header: str
    reason: str
    line: int = 0  # 1-based line where the hunk expected its lines
    expected: tuple[str, ...] = ()
    actual: tuple[str, ...] = ()  # what upstream has there now

    def describe(self) -> str:
        where = f"{self.file}, hunk {self.hunk} ({self.header})" if self.hunk else self.file
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class PatchStatus:
    position: int  # 1-based in the series
    entry: SeriesEntry
    state: PatchState
    failures: tuple[HunkFailure, ...] = ()
    message: str = ""

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass(frozen=True)
class ApplyResult:
    tree: Path
    applied: tuple[str, ...]  # patches this call applied (or reverted)
    already: tuple[str, ...]  # patches already in that state
    series_hash: str


@dataclass(frozen=True)
class CheckReport:
    target: str  # "rev <sha>" / "sdist name==version"
    statuses: tuple[PatchStatus, ...]
    sha256: str | None = None  # for sdist checks: the sha256 to pin

    @property
    def ok(self) -> bool:
        return all(s.state in (PatchState.APPLIES, PatchState.SKIPPED) for s in self.statuses)


@dataclass(frozen=True)
class RefreshResult:
    directory: Path
    patches: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    kept_conditions: tuple[str, ...]


# --------------------------------------------------------------------------- git apply


def _git_apply(tree: Path, patch: Path, *, reverse: bool = False, check: bool = False) -> subprocess.CompletedProcess[bytes]:
    args = ["apply", "--whitespace=nowarn", "-p1"]
    if reverse:
        args.append("--reverse")
    if check:
        args.append("--check")
    env = dict(os.environ)
    # Never let git discover an enclosing repository (the monorepo): paths are relative to `tree`.
    env["GIT_CEILING_DIRECTORIES"] = str(Path(tree).resolve().parent)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    return run_git([*args, str(Path(patch).resolve())], cwd=tree, check=False, env=env)


def _probe(tree: Path, entry: SeriesEntry) -> tuple[PatchState, str]:
    fwd = _git_apply(tree, entry.path, check=True)
    rev = _git_apply(tree, entry.path, check=True, reverse=True)
    if fwd.returncode == 0 and rev.returncode == 0:
        return PatchState.AMBIGUOUS, "applies both forward and in reverse"
    if fwd.returncode == 0:
        return PatchState.APPLIES, ""
    if rev.returncode == 0:
        return PatchState.APPLIED, ""
    return PatchState.FAILS, fwd.stderr.decode(errors="replace").strip()


# --------------------------------------------------------------------------- failure analysis

Reader = Callable[[str], "bytes | None"]


def analyse(patch: ParsedPatch, read: Reader) -> tuple[HunkFailure, ...]:
    """Find, per file, the first hunk whose lines are not where (or anywhere) it expects them."""
    failures = []
    for fp in patch.files:
        data = read(fp.old_path) if fp.old_path else read(fp.new_path or "")
        if fp.old_path is None:
            if data is not None:
                failures.append(HunkFailure(fp.path, 0, "", "the patch creates this file, but it already exists"))
            continue
        if data is None:
            failures.append(HunkFailure(fp.old_path, 0, "", "the file does not exist upstream any more"))
            continue
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        delta = 0
        for h in fp.hunks:
            expect_at = max(0, h.old_start - 1 + delta) if h.old else max(0, h.old_start + delta)
            pos = _find(lines, h.old, expect_at)
            if pos is None:
                actual = tuple(lines[expect_at: expect_at + max(len(h.old), 1)])
                failures.append(HunkFailure(
                    fp.old_path, h.index, h.header,
                    f"its {len(h.old)} expected line(s) are not at line {expect_at + 1} nor anywhere else in the file",
                    expect_at + 1, h.old, actual,
                ))
                break
            lines[pos: pos + len(h.old)] = list(h.new)
            delta = pos - (h.old_start - 1) + len(h.new) - len(h.old)
    return tuple(failures)


def _find(lines: list[str], want: tuple[str, ...], near: int) -> int | None:
    if not want:
        return min(near, len(lines))
    n = len(want)
    hits = [p for p in range(len(lines) - n + 1) if lines[p] == want[0] and tuple(lines[p: p + n]) == want]
    return min(hits, key=lambda p: abs(p - near)) if hits else None


def _fs_reader(tree: Path) -> Reader:
    def read(rel: str) -> bytes | None:
        p = tree / rel
        return p.read_bytes() if p.is_file() else None
    return read


def _git_reader(repo: Path, rev: str) -> Reader:
    def read(rel: str) -> bytes | None:
        proc = run_git(["show", f"{rev}:{rel}"], cwd=repo, check=False)
        return proc.stdout if proc.returncode == 0 else None
    return read


# --------------------------------------------------------------------------- status


def _touched(entries: Iterable[SeriesEntry]) -> tuple[dict[str, ParsedPatch], set[str]]:
    parsed = {e.name: parse_patch(e.path) for e in entries}
    return parsed, {p for pp in parsed.values() for p in pp.paths}


def _sandbox(read: Reader, paths: Iterable[str], dest: Path) -> None:
    for rel in paths:
        data = read(rel)
        if data is not None:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def status(tree: Path | None, series: Series, ctx: PatchContext, *, reader: Reader | None = None) -> tuple[PatchStatus, ...]:
    """Per-patch state against ``tree`` (or ``reader``), simulated on copies: nothing is touched.

    Patches are simulated in order, so patch 3 is judged on the tree as patches 1-2 leave it.
    """
    read = reader or _fs_reader(Path(tree))  # type: ignore[arg-type]
    selected = series.select(ctx)
    parsed, paths = _touched(selected)
    out: list[PatchStatus] = []
    with tempfile.TemporaryDirectory(prefix="kforge-patch-status-") as tmp:
        sandbox = Path(tmp) / "tree"
        sandbox.mkdir()
        _sandbox(read, paths, sandbox)
        for pos, entry in enumerate(series.entries, 1):
            if entry not in selected:
                unmet = ", ".join(str(c) for c in entry.unmet(ctx))
                out.append(PatchStatus(pos, entry, PatchState.SKIPPED, message=f"not for this build ({unmet})"))
                continue
            state, msg = _probe(sandbox, entry)
            failures: tuple[HunkFailure, ...] = ()
            if state is PatchState.APPLIES:
                _git_apply(sandbox, entry.path)
            elif state is PatchState.FAILS:
                failures = analyse(parsed[entry.name], _fs_reader(sandbox)) or (
                    HunkFailure("?", 0, "", msg or "git apply refused it"),)
            out.append(PatchStatus(pos, entry, state, failures, msg))
    return tuple(out)


# --------------------------------------------------------------------------- apply / revert


class _Backup:
    """Bytes and modes of every path a series may touch, to restore them exactly."""

    def __init__(self, tree: Path, paths: Iterable[str]) -> None:
        self.tree = tree
        self.files: dict[str, tuple[bytes, int] | None] = {}
        self.dirs: set[Path] = set()
        for rel in paths:
            p = tree / rel
            self.files[rel] = (p.read_bytes(), p.stat().st_mode) if p.is_file() else None
            d = p.parent
            while d != tree and not d.exists():
                self.dirs.add(d)
                d = d.parent

    def restore(self) -> None:
        for rel, saved in self.files.items():
            p = self.tree / rel
            if saved is None:
                if p.is_file() or p.is_symlink():
                    p.unlink()
                continue
            data, mode = saved
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.is_file() or p.read_bytes() != data:
                p.write_bytes(data)
            os.chmod(p, mode)
        for d in sorted(self.dirs, key=lambda d: len(d.parts), reverse=True):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()


def _failure_error(verb: str, pos: int, total: int, entry: SeriesEntry, failures: tuple[HunkFailure, ...],
                   tree: Path, msg: str) -> PatchError:
    first = failures[0] if failures else None
    why = first.describe() if first else (msg or "git apply refused it")
    if first and first.actual is not None and first.hunk:
        why += "; upstream has there: " + " | ".join(line.strip() for line in first.actual[:6])
    return PatchError(
        f"patch {pos} of {total} ({entry.name}) does not {verb} to {tree}; the tree was restored unchanged",
        why=why,
        fix=f"run `kforge patches status {entry.path.parent.name}` for the full report, then rebase the patch "
            "(docs/patches.md)",
    )


def _run_series(tree: Path, series: Series, ctx: PatchContext, *, reverse: bool) -> ApplyResult:
    tree = Path(tree)
    if not tree.is_dir():
        raise PatchError(f"{tree} is not a directory", fix="prepare the source first (kforge sources sync / fetch)")
    selected = series.select(ctx)
    parsed, paths = _touched(selected)
    order = list(enumerate(selected, 1))
    if reverse:
        order.reverse()
    backup = _Backup(tree, paths)
    done: list[str] = []
    already: list[str] = []
    verb = "revert" if reverse else "apply"
    try:
        for pos, entry in order:
            state, msg = _probe(tree, entry)
            target_state = PatchState.APPLIES if reverse else PatchState.APPLIED
            if state is target_state:  # reverting a patch that is not applied / applying one that is
                already.append(entry.name)
                continue
            if state is PatchState.AMBIGUOUS:
                raise PatchError(
                    f"cannot tell whether patch {pos} ({entry.name}) is applied in {tree}; the tree was restored",
                    why=msg, fix="give the patch more context lines (git format-patch -U5) and refresh the series")
            if state is PatchState.FAILS:
                failures = analyse(parsed[entry.name], _fs_reader(tree)) if not reverse else ()
                raise _failure_error(verb, pos, len(selected), entry, failures, tree, msg)
            proc = _git_apply(tree, entry.path, reverse=reverse)
            if proc.returncode != 0:
                raise _failure_error(verb, pos, len(selected), entry, (), tree, proc.stderr.decode(errors="replace"))
            done.append(entry.name)
    except BaseException:
        backup.restore()
        raise
    return ApplyResult(tree, tuple(done), tuple(already), series_hash(series, ctx))


def apply(tree: Path, series: Series, ctx: PatchContext) -> ApplyResult:
    """Apply the patches selected for ``ctx``, all or nothing; already-applied ones are skipped."""
    return _run_series(tree, series, ctx, reverse=False)


def revert(tree: Path, series: Series, ctx: PatchContext) -> ApplyResult:
    """Undo the selected patches in reverse order, all or nothing; unapplied ones are skipped."""
    return _run_series(tree, series, ctx, reverse=True)


# --------------------------------------------------------------------------- check


def check_rev(repo: Path, rev: str, series: Series, ctx: PatchContext, *, fetch: bool = True) -> CheckReport:
    """Does the series apply to upstream commit ``rev`` of ``repo``? Reads objects only:
    the checkout, its index and HEAD are not touched (a missing commit is fetched from origin)."""
    repo = Path(repo)
    proc = run_git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo, check=False)
    if proc.returncode != 0 and fetch:
        run_git(["fetch", "--quiet", "origin", rev], cwd=repo, check=False)
        proc = run_git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo, check=False)
    if proc.returncode != 0 or not has_commit(repo, proc.stdout.decode().strip()):
        raise SourceError(f"{rev} is not a commit in {repo}", why="not found locally nor on origin",
                          fix=f"git -C {repo} fetch origin, and check the revision")
    sha = proc.stdout.decode().strip()
    return CheckReport(f"rev {sha[:12]}", status(None, series, ctx, reader=_git_reader(repo, sha)))


def check_sdist(name: str, version: str, series: Series, ctx: PatchContext, *, cache_dir: Path,
                sha256: str | None = None, index_url: str | None = None,
                opener: _sdist.Opener | None = None) -> CheckReport:
    """Does the series apply to the sdist ``name==version``? Fetches it into the cache (verifying
    sha256: the pin if given, else the index's) and reads the touched files from the archive."""
    got = _sdist.fetch(name, version, sha256, cache_dir=cache_dir, index_url=index_url, opener=opener)
    with _sdist.open_archive(got.path) as read:  # only the files the series touches are read
        statuses = status(None, series, ctx, reader=read)
    return CheckReport(f"sdist {name}=={version}", statuses, got.sha256)


# --------------------------------------------------------------------------- refresh


def _slug(name: str) -> str:
    stem = name[:-6] if name.endswith(".patch") else name
    return stem.split("-", 1)[1] if stem[:4].isdigit() and "-" in stem else stem


def refresh(directory: Path, repo: Path, base: str, head: str = "HEAD") -> RefreshResult:
    """Regenerate ``directory`` (series + .patch files) from commits ``base..head`` of ``repo``.

    Use it after rebasing the working branch that carries our patches onto a new pin.
    Conditions of existing entries are kept (matched by the patch's subject slug); new
    patches are unconditional. The directory is swapped in by renames, and the old one is restored if the swap fails.
    """
    directory, repo = Path(directory).resolve(), Path(repo).resolve()
    if not is_checkout(repo):  # else git would walk up and format-patch the monorepo's own commits
        raise SourceError(f"{repo} is not a git checkout", fix="pass --repo with the rebased working tree, or run `kforge sources sync` first")
    old = load_series(directory) if (directory / "series").is_file() else Series(directory)
    if run_git(["merge-base", "--is-ancestor", base, head], cwd=repo, check=False).returncode != 0:
        raise PatchError(f"{base} is not an ancestor of {head} in {repo}",
                         fix="rebase the working branch onto the new pin first, then refresh with --base <new pin>")
    count = int(run_git(["rev-list", "--count", f"{base}..{head}"], cwd=repo).stdout.decode().strip())
    if count == 0:
        raise PatchError(f"no commits between {base} and {head} in {repo}", fix="commit the patches on the branch")
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-refresh-", dir=parent))
    staging.chmod(0o755)
    try:
        run_git(["format-patch", "--quiet", "--zero-commit", "--no-signature", "--full-index", "-N",
                 "-o", str(staging), f"{base}..{head}"], cwd=repo)
        new_names = sorted(p.name for p in staging.glob("*.patch"))
        by_slug = {_slug(e.name): e for e in old.entries}
        lines = list(old.header) or ["# Patch series: applied in order. Conditions: see docs/patches.md."]
        kept = []
        for name in new_names:
            prev = by_slug.get(_slug(name))
            cond = prev.condition_text if prev else ""
            if cond:
                kept.append(f"{name} {cond}")
            lines.append(f"{name}  {cond}".rstrip())
        (staging / "series").write_text("\n".join(lines) + "\n", encoding="utf-8")
        if directory.is_dir():  # keep other files (README, notes)
            for f in directory.iterdir():
                if f.is_file() and f.suffix != ".patch" and f.name != "series":
                    shutil.copy2(f, staging / f.name)
        if directory.is_dir():  # and subdirectories, whole
            for d in directory.iterdir():
                if d.is_dir():
                    shutil.copytree(d, staging / d.name, symlinks=True)
        backup = parent / f".{directory.name}-old"
        if backup.exists():
            shutil.rmtree(backup)
        if directory.exists():
            os.replace(directory, backup)
        try:
            os.replace(staging, directory)
        except OSError:
            if backup.exists():  # put the old series back: all or nothing
                os.replace(backup, directory)
            raise
        shutil.rmtree(backup, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    new_slugs = {_slug(n) for n in new_names}
    old_slugs = {_slug(e.name): e.name for e in old.entries}
    return RefreshResult(
        directory,
        tuple(new_names),
        tuple(n for n in new_names if _slug(n) not in old_slugs),
        tuple(name for s, name in old_slugs.items() if s not in new_slugs),
        tuple(kept),
    )


def hunk_report(f: HunkFailure) -> str:
    """A few lines showing what the hunk expected and what upstream has there now."""
    if not f.hunk:
        return f.describe()
    out = [f.describe(), f"  the patch expects, at line {f.line}:"]
    out += [f"      {line}" for line in f.expected]
    out.append("  upstream has there ('!' marks the lines that differ):")
    for i, line in enumerate(f.actual):
        mark = " " if i < len(f.expected) and f.expected[i] == line else "!"
        out.append(f"    {mark} {line}")
    if not f.actual:
        out.append("    (end of file)")
    return "\n".join(out)

