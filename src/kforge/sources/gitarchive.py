"""Pinned git trees as compressed archives (nested submodules included) in kforge's cache.

An offline host has no ``externals/`` checkout and no mirror, so the kit carries each
pinned tree as ``<cache>/git/<owner>+<name>-<commit>.tar.xz``: ``git archive`` of the
commit and, recursively, of every nested submodule at the commit its parent records,
read from git objects (a checkout's or a mirror's), without a working tree. A sidecar
``<file>.json`` records the sha256 and what is inside; :func:`find` verifies the bytes
before :mod:`kforge.sources.upstream` unpacks them into a scratch copy.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kforge.errors import SourceError
from kforge.fsutil import PUBLIC_FILE_MODE, atomic_write_text, sha256_file
from kforge.sources.gittree import has_commit, submodules_at
from kforge.sources.mirrors import Mirrors, url_owner_name

SUBDIR = "git"

#: Top-level folders of a *nested* submodule left out by default: documentation, images and
#: unit tests of the libraries (cutlass: 54 MB docs, 21 MB media, 15 MB test at the pins).
#: No build of ours reads them; ``--keep-all`` keeps them.
NESTED_TRIM = ("docs", "media", "test", ".github")
#: Left out of the upstream itself (its own tests stay: the GPU tests run them).
TOP_TRIM = (".github",)


@dataclass(frozen=True)
class NestedEntry:
    """A nested submodule inside an archive (or left out of it, with the reason)."""

    path: str  # relative to the top of the tree
    url: str
    commit: str
    read_from: str = ""  # the git directory its objects came from
    skipped: str = ""  # why it is not in the archive ("" = it is)
    substitute: str = ""  # a folder whose files stand in for it (not the pinned commit's), "" = none


@dataclass(frozen=True)
class ArchivedTree:
    """One pinned tree in the cache: the file, its sha256, and what it holds."""

    path: Path
    url: str
    commit: str
    top: str  # the archive's single top folder
    sha256: str
    size: int
    nested: tuple[NestedEntry, ...] = ()
    trimmed: tuple[str, ...] = field(default=())

    @property
    def skipped(self) -> tuple[NestedEntry, ...]:
        return tuple(n for n in self.nested if n.skipped)

    @property
    def substituted(self) -> tuple[NestedEntry, ...]:
        return tuple(n for n in self.nested if n.substitute)

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.path.name, "url": self.url, "commit": self.commit, "top": self.top,
            "sha256": self.sha256, "size": self.size, "trimmed": list(self.trimmed),
            "nested": [{"path": n.path, "url": n.url, "commit": n.commit, "skipped": n.skipped,
                        **({"substitute": n.substitute} if n.substitute else {})} for n in self.nested],
        }

    @classmethod
    def from_json(cls, path: Path, data: dict[str, object]) -> ArchivedTree:
        nested = tuple(NestedEntry(str(n["path"]), str(n["url"]), str(n["commit"]), skipped=str(n.get("skipped", "")),
                                   substitute=str(n.get("substitute", "")))
                       for n in data.get("nested", []))  # type: ignore[union-attr]
        return cls(path, str(data["url"]), str(data["commit"]), str(data["top"]), str(data["sha256"]),
                   int(data["size"]), nested, tuple(data.get("trimmed", ())))  # type: ignore[arg-type]


#: Compressions ``write`` offers, by file suffix; ``find`` looks for each. xz is about 30% smaller
#: than gzip on these trees (flashinfer v0.6.17 with cccl/cutlass/nixl: 16.4 MiB against 23.6 MiB).
COMPRESSIONS = {"xz": ".tar.xz", "gz": ".tar.gz"}


def file_name(url: str, commit: str, compression: str = "xz") -> str:
    owner, name = url_owner_name(url)
    stem = f"{owner}+{name}-{commit}" if owner else f"{name}-{commit}"
    return stem + COMPRESSIONS[compression]


def cache_folder(cache_dir: Path) -> Path:
    return Path(cache_dir) / SUBDIR


def find(cache_dir: Path | None, url: str, commit: str) -> ArchivedTree | None:
    """The cached archive of ``url`` at ``commit`` if present *and* its bytes match its record."""
    if cache_dir is None:
        return None
    for compression in COMPRESSIONS:
        path = cache_folder(cache_dir) / file_name(url, commit, compression)
        meta = path.with_name(path.name + ".json")
        if not path.is_file() or not meta.is_file():
            continue
        try:
            record = ArchivedTree.from_json(path, json.loads(meta.read_text()))
        except (ValueError, KeyError, TypeError):
            continue
        if record.commit == commit and sha256_file(path) == record.sha256:
            return record
    return None


# --------------------------------------------------------------------------- writing

#: ``reader(repo, commit, prefix, excludes) -> tar bytes``: ``git archive``; tests may inject their own.
Reader = Callable[[Path, str, str, Sequence[str]], bytes]


def git_archive(repo: Path, commit: str, prefix: str, excludes: Sequence[str]) -> bytes:
    cmd = ["git", "archive", "--format=tar", f"--prefix={prefix}", commit, "--", "."]
    cmd += [f":(exclude,top){e}" for e in excludes]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True)
    if proc.returncode != 0:
        raise SourceError(
            f"`git archive {commit[:12]}` failed in {repo}",
            why=proc.stderr.decode(errors="replace").strip()[-600:] or None,
            fix="the repository lacks some of that commit's objects (a partial mirror?): "
                "fetch the full history into it, or use another mirror",
        )
    return proc.stdout


def write(dest_dir: Path, *, url: str, commit: str, top: str, repo: Path, mirrors: Mirrors,
          checkout: Path | None = None, skip_nested: Sequence[str] = (), trim: bool = True,
          compression: str = "xz", substitutes: Mapping[str, Path] | None = None,
          reader: Reader = git_archive) -> ArchivedTree:
    """Archive ``repo`` at ``commit`` with its nested submodules into ``dest_dir`` (atomically).

    Each nested submodule's objects come from the matching folder of ``checkout`` if it has
    the commit, else from its mirror. A nested submodule found nowhere is an error naming
    all of them, unless its path is in ``skip_nested`` (then it is recorded as skipped) or in
    ``substitutes`` (then that folder's files are archived in its place, and recorded as such:
    they are not the pinned commit's, and ``kforge sources status`` says so on the host).
    """
    substitutes = dict(substitutes or {})
    folders: list[tuple[Path, str]] = []
    dest_dir.mkdir(parents=True, exist_ok=True)
    parts: list[tuple[Path, str, str, tuple[str, ...]]] = [(repo, commit, f"{top}/", TOP_TRIM if trim else ())]
    nested: list[NestedEntry] = []
    missing: list[str] = []
    queue: list[tuple[Path, str, str, Path | None]] = [(repo, commit, "", checkout)]
    while queue:
        at_repo, at_commit, at_prefix, at_checkout = queue.pop(0)
        for sub in submodules_at(at_repo, at_commit):
            rel = f"{at_prefix}{sub.path}"
            if rel in skip_nested or sub.path in skip_nested:
                nested.append(NestedEntry(rel, sub.url, sub.commit, skipped="--skip-nested"))
                continue
            folder = substitutes.get(rel) or substitutes.get(sub.path)
            if folder is not None:
                if not Path(folder).is_dir():
                    raise SourceError(f"the stand-in folder for {rel} does not exist: {folder}",
                                      fix="give an existing folder with --nested-from PATH=DIR")
                nested.append(NestedEntry(rel, sub.url, sub.commit, substitute=str(Path(folder).resolve())))
                folders.append((Path(folder), f"{top}/{rel}/"))
                continue
            sub_checkout = at_checkout / sub.path if at_checkout is not None else None
            found = _locate(sub.url, sub.commit, sub_checkout, mirrors)
            if found is None:
                mirror = mirrors.find(sub.url) if sub.url else None
                where = (f"mirror {mirror} lacks it" if mirror else f"no mirror for {sub.url or '(no URL)'} in "
                         f"{mirrors.describe()}")
                missing.append(f"{rel} @ {sub.commit[:12]} ({where})")
                continue
            nested.append(NestedEntry(rel, sub.url, sub.commit, read_from=str(found)))
            parts.append((found, sub.commit, f"{top}/{rel}/", NESTED_TRIM if trim else ()))
            queue.append((found, sub.commit, f"{rel}/", sub_checkout if sub_checkout and sub_checkout.is_dir() else None))
    if missing:
        raise SourceError(
            f"cannot archive {top} at {commit[:12]}: {len(missing)} nested submodule(s) not found",
            why="\n".join(missing),
            fix="add a mirror holding those commits (--mirror DIR or $KFORGE_GIT_MIRROR; see docs/patches.md), "
                "or leave them out with --skip-nested PATH if the build does not need them",
        )
    if compression not in COMPRESSIONS:
        raise SourceError(f"unknown compression {compression!r}", fix=f"use one of {', '.join(COMPRESSIONS)}")
    target = dest_dir / file_name(url, commit, compression)
    fd, tmp = tempfile.mkstemp(prefix=".archive-", suffix=COMPRESSIONS[compression], dir=dest_dir)
    os.close(fd)
    options = {"preset": 6} if compression == "xz" else {"compresslevel": 9}
    try:
        with tarfile.open(tmp, f"w:{compression}", format=tarfile.PAX_FORMAT, **options) as out:
            for part_repo, part_commit, prefix, excludes in parts:
                data = reader(part_repo, part_commit, prefix, excludes)
                _copy_members(data, out)
            for folder, prefix in folders:
                for path in sorted(folder.rglob("*")):
                    if path.is_file() or path.is_symlink():
                        out.add(path, arcname=prefix + path.relative_to(folder).as_posix(), recursive=False)
        os.chmod(tmp, PUBLIC_FILE_MODE)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    record = ArchivedTree(target, url, commit, top, sha256_file(target), target.stat().st_size, tuple(nested),
                          NESTED_TRIM if trim else ())
    atomic_write_text(target.with_name(target.name + ".json"), json.dumps(record.to_json(), indent=2) + "\n")
    return record


def _locate(url: str, commit: str, checkout: Path | None, mirrors: Mirrors) -> Path | None:
    if checkout is not None and (checkout / ".git").exists() and has_commit(checkout, commit):
        return checkout
    mirror = mirrors.find(url) if url else None
    if mirror is not None and has_commit(mirror, commit):
        return mirror
    return None


def _copy_members(data: bytes, out: tarfile.TarFile) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as part:
        for member in part.getmembers():
            if member.name in ("pax_global_header",) or member.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
                continue
            member.pax_headers = {}
            fh = part.extractfile(member) if member.isfile() else None
            out.addfile(member, fh)
