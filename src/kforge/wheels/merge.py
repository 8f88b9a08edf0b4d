"""Merge per-job wheelhouses (one per CI build job) into one wheelhouse with one PEP 503 index.

Analyse, then act. Every source wheelhouse is verified first (a wheel whose manifest disagrees with
it, or a corrupt manifest, stops the merge), and every wheel is matched against the others and against
the destination by file name: the same name with another sha256 is a conflict and the merge changes
nothing (``replace=True`` lets the sources win on purpose). Then, under the destination's lock, every
wheel, manifest and report file is staged as a temporary file beside its final name; only when all
of them are staged are they renamed into place, and the index is rewritten once, at the end. A merge
that fails while staging (a full disk) leaves the destination as it was.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kforge.errors import PublishError
from kforge.fsutil import PUBLIC_FILE_MODE, sha256_file
from kforge.wheels import wheelhouse
from kforge.wheels.wheelhouse import MANIFEST_SUFFIX, REPORT_SUFFIX, PublishedWheel


@dataclass(frozen=True)
class MergeResult:
    added: tuple[str, ...]  # <project>/<wheel> copied in
    unchanged: tuple[str, ...]  # already there with the same sha256
    replaced: tuple[str, ...]  # there with another sha256, replaced on purpose
    index: Path


def _key(w: PublishedWheel) -> str:
    return f"{w.project}/{w.filename}"


def plan_merge(dest: Path, sources: tuple[Path, ...], *, replace: bool = False) -> tuple[
        tuple[PublishedWheel, ...], tuple[str, ...], tuple[str, ...]]:
    """(wheels to copy, already there unchanged, to replace); raises on a problem or a conflict."""
    if not sources:
        raise PublishError("nothing to merge", fix="name one or more wheelhouse folders: kforge wheelhouse merge DIR...")
    chosen: dict[str, PublishedWheel] = {}  # file name -> the wheel that will carry it
    for src in sources:
        if not src.is_dir():
            raise PublishError(f"{src} is not a wheelhouse folder", fix="pass the folders the build jobs published into")
        if src.resolve() == dest.resolve():
            raise PublishError(f"{src} is the destination itself", fix="merge other wheelhouses into it")
        found = wheelhouse.scan(src)
        if found.problems:
            raise PublishError(
                f"the wheelhouse {src} does not verify ({len(found.problems)} problem(s)); nothing was merged",
                why="; ".join(str(p) for p in found.problems[:5]),
                fix=f"run kforge wheelhouse verify --wheelhouse {src} and fix or drop that wheelhouse",
            )
        for w in found.wheels:
            seen = chosen.get(w.filename)
            if seen is None:
                chosen[w.filename] = w
            elif seen.sha256 != w.sha256 or seen.project != w.project:
                raise PublishError(
                    f"{w.filename} comes from two wheelhouses with different contents; nothing was merged",
                    why=f"{seen.wheel} has sha256 {seen.sha256[:12]}..., {w.wheel} has {w.sha256[:12]}...",
                    fix="two build jobs produced one file name: give their wheels distinct versions or local "
                        "labels, or merge only the one you mean",
                )
    existing = {w.filename: w for w in wheelhouse.scan(dest).wheels} if dest.is_dir() else {}
    todo, same, replaced = [], [], []
    for name, w in sorted(chosen.items()):
        have = existing.get(name)
        if have is None:
            todo.append(w)
        elif have.sha256 == w.sha256 and have.project == w.project:
            same.append(_key(w))
        elif replace and have.project == w.project:
            todo.append(w)
            replaced.append(_key(w))
        else:
            raise PublishError(
                f"{name} is already in {dest} with different contents; nothing was merged",
                why=f"{have.wheel} has sha256 {have.sha256[:12]}..., {w.wheel} has {w.sha256[:12]}...",
                fix="merge into a fresh folder, or pass --replace to let the merged wheel win"
                    if have.project == w.project else "the two wheels belong to different projects: rename one",
            )
    return tuple(todo), tuple(same), tuple(replaced)


def merge(dest: Path, sources: tuple[Path, ...] | list[Path], *, replace: bool = False,
          lock_timeout: float | None = None, wait: bool = True) -> MergeResult:
    """Merge ``sources`` into ``dest`` (see the module doc); returns what was added."""
    dest = Path(dest)
    srcs = tuple(Path(s) for s in sources)
    plan_merge(dest, srcs, replace=replace)  # fail fast, before taking the lock
    try:
        with wheelhouse.lock_wheelhouse(dest, "wheelhouse merge", lock_timeout, wait):
            todo, same, replaced = plan_merge(dest, srcs, replace=replace)  # again, now that nobody else writes
            staged: list[tuple[str, Path]] = []
            try:
                for w in todo:
                    staged += _stage(dest, w)
                for tmp, final in staged:
                    os.replace(tmp, final)
                staged = []
            finally:
                for tmp, _ in staged:
                    Path(tmp).unlink(missing_ok=True)
            index = wheelhouse.write_index(dest)
    except OSError as exc:
        raise wheelhouse.os_error(exc, dest, "merge") from None
    return MergeResult(tuple(_key(w) for w in todo if _key(w) not in replaced), same, replaced, index)


def _stage(dest: Path, w: PublishedWheel) -> list[tuple[str, Path]]:
    """Copy one wheel, its manifest and its report files to temp files in ``dest``; return (temp, final) pairs."""
    folder = dest / w.project
    wheelhouse.public_dirs(folder)
    wheel_tmp = _copy(w.wheel, folder)
    if sha256_file(Path(wheel_tmp)) != w.sha256:
        Path(wheel_tmp).unlink(missing_ok=True)
        raise PublishError(f"{w.wheel} changed while it was being merged", fix="run the merge again")
    # renamed in this order: the manifest first, the wheel last (as publish does)
    pairs: list[tuple[str, Path]] = []
    try:
        pairs.append((_copy(w.manifest, folder), folder / f"{w.filename}{MANIFEST_SUFFIX}"))
        report = w.wheel.parent / f"{w.filename}{REPORT_SUFFIX}"
        if report.is_dir():
            wheelhouse.public_dirs(folder / report.name)
            for f in sorted(report.iterdir()):
                if f.is_file():
                    pairs.append((_copy(f, folder / report.name), folder / report.name / f.name))
    except BaseException:
        for tmp in [wheel_tmp, *(t for t, _ in pairs)]:
            Path(tmp).unlink(missing_ok=True)
        raise
    pairs.append((wheel_tmp, folder / w.filename))
    return pairs


def _copy(src: Path, folder: Path) -> str:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{wheelhouse.TMP_MARK}{src.name}.")
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            while block := fin.read(1 << 20):
                fout.write(block)
            fout.flush()
            os.fsync(fout.fileno())
        os.chmod(tmp, PUBLIC_FILE_MODE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp
