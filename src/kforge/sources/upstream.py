"""Upstream sources: pinned git submodules, pinned sdists, and local ``kernels/``.

The specs are plain data (:mod:`kforge.config.source`) that the config builds from forge.toml. Three operations:

* :func:`status` says whether a source is ready: ``pinned``, ``missing``, ``dirty``,
  ``wrong-commit``, ``cached``, ``not-fetched``, ``present``, with the command that fixes it.
* :func:`sync` initialises a submodule and checks out its pinned commit.
* :func:`prepare` makes a *scratch copy* for one build (an export of the checkout, an
  unpacked verified sdist, or a copy of ``kernels/<name>``). Builds and patches only ever
  touch that copy; ``externals/`` stays pristine, and several targets can build side by side.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kforge.config.source import GitSource, LocalSource, SdistSource, Source
from kforge.errors import SourceError
from kforge.fsutil import sha256_file
from kforge.sources import gitarchive
from kforge.sources import sdist as _sdist
from kforge.sources.gittree import has_commit, nested_states, run_git, submodules_at
from kforge.sources.mirrors import NO_MIRRORS, Mirrors, git_config_args


class SourceState(str, Enum):
    PINNED = "pinned"  # git: checked out at the pin, clean
    MISSING = "missing"  # git: not initialised; local: directory absent
    DIRTY = "dirty"  # git: local modifications or untracked files
    WRONG_COMMIT = "wrong-commit"  # git: HEAD is not the pin
    CACHED = "cached"  # sdist: in the cache with the pinned sha256
    NOT_FETCHED = "not-fetched"  # sdist: not in the cache yet
    PRESENT = "present"  # local: directory exists
    IN_KIT = "in-kit"  # git: no checkout, but the offline kit's archive of the pin is in the cache

    def __str__(self) -> str:
        return self.value


#: States in which a build may go ahead (an sdist is fetched on demand).
READY = frozenset({SourceState.PINNED, SourceState.CACHED, SourceState.NOT_FETCHED, SourceState.PRESENT,
                   SourceState.IN_KIT})


@dataclass(frozen=True)
class SourceStatus:
    name: str
    kind: str  # "git" | "sdist" | "local"
    state: SourceState
    pin: str  # commit, "name==version", or the local path
    actual: str | None = None  # HEAD commit, cached file, ...
    detail: str = ""
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.state in READY


@dataclass(frozen=True)
class PreparedSource:
    """A scratch copy of a source, ready to patch and build."""

    tree: Path
    pin: str  # commit / sha256 / content hash of the local tree
    kind: str
    spec: Source
    dirty: bool = False  # built from a dirty or mis-pinned checkout (--allow-dirty)
    note: str = ""


# --------------------------------------------------------------------------- git helpers




def is_checkout(path: Path) -> bool:
    """True if ``path`` is the top of a git working tree (a submodule has a ``.git`` file)."""
    if not (path / ".git").exists():
        return False
    proc = run_git(["rev-parse", "--show-toplevel"], cwd=path, check=False)
    return proc.returncode == 0 and Path(proc.stdout.decode().strip()).resolve() == path.resolve()


def is_repository(path: Path) -> bool:
    """True if ``path`` is a git repository of any kind: a checkout or a bare mirror."""
    if not Path(path).is_dir():
        return False
    proc = run_git(["rev-parse", "--git-dir"], cwd=path, check=False)
    return proc.returncode == 0


def head_commit(path: Path) -> str | None:
    proc = run_git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=path, check=False)
    return proc.stdout.decode().strip() or None


def dirty_files(path: Path) -> list[str]:
    """Porcelain lines for modified, staged or untracked (not ignored) files."""
    out = run_git(["status", "--porcelain", "--untracked-files=normal", "--ignore-submodules=none"], cwd=path).stdout
    return [line for line in out.decode(errors="replace").splitlines() if line.strip()]


def gitlink(root: Path, path: str) -> str | None:
    """The commit the superproject's index records for submodule ``path`` (mode 160000)."""
    proc = run_git(["ls-files", "--stage", "--", path], cwd=root, check=False)
    for line in proc.stdout.decode().splitlines():
        meta, _, p = line.partition("\t")
        mode, sha, _stage = meta.split()
        if mode == "160000" and p == path:
            return sha
    return None


# --------------------------------------------------------------------------- status


def status(root: Path, name: str, spec: Source, *, cache_dir: Path | None = None) -> SourceStatus:
    """Where ``spec`` stands on disk. Never raises for a missing or dirty source."""
    root = Path(root)
    if isinstance(spec, GitSource):
        return _git_status(root, name, spec, cache_dir=cache_dir)
    if isinstance(spec, SdistSource):
        pin = f"{spec.name}=={spec.version}"
        cached = _sdist.cached_sdist(cache_dir, spec.name, spec.version, spec.sha256) if cache_dir else None
        if cached:
            return SourceStatus(name, "sdist", SourceState.CACHED, pin, str(cached), f"sha256 {spec.sha256[:12]}… verified")
        return SourceStatus(name, "sdist", SourceState.NOT_FETCHED, pin, None, "fetched on first build",
                            fix=f"run `kforge sources fetch {name}`")
    if isinstance(spec, LocalSource):
        path = root / spec.path
        if path.is_dir():
            return SourceStatus(name, "local", SourceState.PRESENT, spec.path, tree_hash(path)[:12])
        return SourceStatus(name, "local", SourceState.MISSING, spec.path, None, f"{spec.path} does not exist",
                            fix=f"create {spec.path} or fix the project's source in forge.toml")
    raise TypeError(f"unknown source spec {spec!r}")


def _git_status(root: Path, name: str, spec: GitSource, *, cache_dir: Path | None = None) -> SourceStatus:
    path = root / spec.path
    sync_cmd = f"run `kforge sources sync {name}` (or `git submodule update --init --recursive -- {spec.path}`)"
    link = gitlink(root, spec.path) if (root / ".git").exists() else None
    link_note = ""
    if link and link != spec.commit:
        link_note = f"; the superproject records {link[:12]} but forge.toml pins {spec.commit[:12]}"
    if not path.is_dir() or not is_checkout(path):
        kit = gitarchive.find(cache_dir, spec.url, spec.commit)
        if kit is not None:
            skipped = f"; left out: {', '.join(n.path for n in kit.skipped)}" if kit.skipped else ""
            skipped += (f"; stand-ins (not the pinned commit): {', '.join(n.path for n in kit.substituted)}"
                        if kit.substituted else "")
            return SourceStatus(name, "git", SourceState.IN_KIT, spec.commit, spec.commit,
                                f"no checkout; the kit's {kit.path.name} (sha256 verified) is used{skipped}")
        return SourceStatus(name, "git", SourceState.MISSING, spec.commit, None,
                            f"{spec.path} is not initialised" + link_note, fix=sync_cmd)
    head = head_commit(path)
    nested = nested_states(path)
    uninit = [n for n in nested if not n.initialised]
    if uninit:
        return SourceStatus(
            name, "git", SourceState.MISSING, spec.commit, head,
            f"nested submodule(s) not initialised: {', '.join(n.path for n in uninit)} (an export would lack "
            f"their files)" + link_note,
            fix=f"run `kforge sources sync {name}` (or `git -C {spec.path} submodule update --init --recursive`)",
        )
    moved = {n.path: n for n in nested if n.flag == "+"}
    dirty = dirty_files(path)
    edits = [line for line in dirty if line[3:] not in moved]
    if edits:
        shown = ", ".join(line[3:] for line in edits[:5]) + (f" and {len(edits) - 5} more" if len(edits) > 5 else "")
        return SourceStatus(
            name, "git", SourceState.DIRTY, spec.commit, head,
            f"{len(edits)} changed file(s): {shown}" + link_note,
            fix=f"move the changes into a patch (see docs/patches.md), then `git -C {spec.path} checkout -- . && "
                f"git -C {spec.path} clean -fd`; or build with --allow-dirty",
        )
    if head != spec.commit:
        return SourceStatus(name, "git", SourceState.WRONG_COMMIT, spec.commit, head,
                            f"HEAD is {(head or 'unborn')[:12]}, pinned {spec.commit[:12]}" + link_note,
                            fix=sync_cmd if not link_note else f"{sync_cmd}; and make forge.toml and the gitlink agree")
    if moved:
        shown = ", ".join(f"{n.path} at {n.commit[:12]}" for n in moved.values())
        return SourceStatus(name, "git", SourceState.WRONG_COMMIT, spec.commit, head,
                            f"nested submodule(s) not at the commit the pin records: {shown}" + link_note,
                            fix=f"run `kforge sources sync {name}` (or `git -C {spec.path} submodule update --init "
                                f"--recursive`)")
    return SourceStatus(name, "git", SourceState.PINNED, spec.commit, head, link_note.lstrip("; "))


# --------------------------------------------------------------------------- sync


def sync(root: Path, spec: GitSource, *, name: str | None = None, mirrors: Mirrors = NO_MIRRORS) -> SourceStatus:
    """Initialise the submodule, check out the pinned commit, and initialise nested submodules recursively.

    With ``mirrors``, every clone and fetch (nested ones too) is sent to the local mirror of its
    URL when there is one (``-c url.<mirror>.insteadOf=<url>``; see :mod:`kforge.sources.mirrors`).
    A dirty checkout is refused: sync never throws away someone's edits.
    """
    root = Path(root)
    name = name or Path(spec.path).name
    path = root / spec.path
    mirror = mirrors.find(spec.url)
    redirect = git_config_args([(spec.url, mirror)] if mirror else [])
    via = f" (through the mirror {mirror})" if mirror else (f" (no mirror for it in {mirrors.describe()})" if mirrors else "")
    if not is_checkout(path):
        if mirror is not None and not has_commit(mirror, spec.commit):
            raise SourceError(f"pinned commit {spec.commit} of {name} is not in the mirror {mirror}",
                              why=f"{spec.url} is sent to that mirror, and it lacks the commit (a stale mirror?)",
                              fix=f"update the mirror (`git -C {mirror} fetch --prune origin '+refs/*:refs/*'` "
                                  "where it can reach upstream), or point --mirror / $KFORGE_GIT_MIRROR elsewhere")
        _submodule_update(root, [spec.path], redirect, what=f"{name}: cloning {spec.url}{via}")
    if not is_checkout(path):
        raise SourceError(
            f"{spec.path} is still not a checkout after `git submodule update --init`",
            why="it is probably not declared in .gitmodules",
            fix=f"git submodule add {spec.url} {spec.path}",
        )
    dirty = [line for line in dirty_files(path) if not _is_gitlink_line(path, line)]
    if dirty:
        raise SourceError(
            f"{spec.path} has local changes; sync will not overwrite them",
            why=f"{len(dirty)} changed file(s), e.g. {dirty[0][3:]}",
            fix=f"turn them into a patch (docs/patches.md), or discard them: git -C {spec.path} checkout -- . && "
                f"git -C {spec.path} clean -fd",
        )
    if head_commit(path) != spec.commit:
        if not has_commit(path, spec.commit):
            run_git([*redirect, "fetch", "--quiet", "origin", spec.commit], cwd=path, check=False)
        if not has_commit(path, spec.commit):
            raise SourceError(
                f"pinned commit {spec.commit} is not in {spec.url}{via}",
                why="fetching it from origin did not find it",
                fix="check the commit in forge.toml, or the submodule URL in .gitmodules"
                    + ("; or update the mirror" if mirror else ""),
            )
        run_git(["checkout", "--quiet", "--detach", spec.commit], cwd=path)
    _sync_nested(path, spec.commit, mirrors, chain=name)
    return status(root, name, spec)


def _is_gitlink_line(repo: Path, line: str) -> bool:
    """A porcelain line for a nested submodule at another commit (sync moves it; not an edit)."""
    return gitlink(repo, line[3:]) is not None


def _submodule_update(repo: Path, paths: Sequence[str], redirect: Sequence[str], *, what: str) -> None:
    try:
        run_git([*redirect, "submodule", "update", "--init", "--", *paths], cwd=repo)
    except SourceError as exc:
        text = exc.render()
        if redirect and ("unable to read" in text or "repository corruption" in text):
            fix = ("the mirror lacks some objects of that commit (a partial snapshot), so git cannot clone from "
                   "it: complete the mirror (`git fetch` into it where upstream is reachable), or build from an "
                   "offline kit, whose trimmed archive may not need the missing files (`kforge sources kit build`)")
        else:
            fix = "offline? give a mirror directory with --mirror DIR or $KFORGE_GIT_MIRROR (docs/patches.md, 'Mirrors')"
        raise SourceError(f"{what} failed", why=text, fix=fix) from exc


def _sync_nested(checkout: Path, commit: str, mirrors: Mirrors, *, chain: str) -> None:
    """``git submodule update --init`` one level at a time, each URL sent to its mirror, then recurse."""
    subs = submodules_at(checkout, commit)
    if not subs:
        return
    mapping = []
    for sub in subs:
        mirror = mirrors.find(sub.url) if sub.url else None
        if mirror is not None:
            if not has_commit(mirror, sub.commit):
                raise SourceError(
                    f"{chain}: nested submodule {sub.path} pins {sub.commit}, which the mirror {mirror} lacks",
                    why=f"{sub.url} is sent to that mirror (a stale or partial snapshot?)",
                    fix="update that mirror, or give one that holds the commit (--mirror DIR / $KFORGE_GIT_MIRROR)",
                )
            mapping.append((sub.url, mirror))
    redirect = git_config_args(mapping)
    no_mirror = [s.url for s in subs if s.url and mirrors and mirrors.find(s.url) is None]
    note = f" (no mirror for {', '.join(no_mirror)})" if no_mirror else ""
    run = [s.path for s in subs]
    _submodule_update(checkout, run, redirect, what=f"{chain}: initialising nested submodules {', '.join(run)}{note}")
    for sub in subs:
        _sync_nested(checkout / sub.path, sub.commit, mirrors, chain=f"{chain}/{sub.path}")


# --------------------------------------------------------------------------- prepare


def prepare(root: Path, spec: Source, scratch_dir: Path, *, allow_dirty: bool = False, cache_dir: Path,
            name: str | None = None, opener: _sdist.Opener | None = None) -> PreparedSource:
    """Make a fresh scratch copy of the source under ``scratch_dir`` and return it.

    ``scratch_dir`` is emptied first. Git sources refuse a missing, dirty or mis-pinned
    checkout unless ``allow_dirty`` (missing is always refused). Sdists are fetched into
    ``cache_dir``, verified against the sha256 pin, and only then unpacked.
    """
    root, scratch_dir = Path(root), Path(scratch_dir)
    name = name or _default_name(spec)
    _reset_dir(root, scratch_dir)
    if isinstance(spec, GitSource):
        return _prepare_git(root, name, spec, scratch_dir, allow_dirty, cache_dir)
    if isinstance(spec, SdistSource):
        got = _sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache_dir, index_url=spec.index_url,
                           opener=opener)
        tree = _sdist.unpack(got.path, scratch_dir)
        return PreparedSource(tree, got.sha256, "sdist", spec, note=f"{spec.name}=={spec.version}")
    if isinstance(spec, LocalSource):
        src = root / spec.path
        if not src.is_dir():
            raise SourceError(f"local source {spec.path} does not exist", fix="fix the project's source in forge.toml")
        tree = scratch_dir / src.name
        shutil.copytree(src, tree, symlinks=True,
                        ignore=shutil.ignore_patterns("build", "__pycache__", "*.egg-info", ".pytest_cache"))
        return PreparedSource(tree, "local:" + tree_hash(tree), "local", spec, note=spec.path)
    raise TypeError(f"unknown source spec {spec!r}")


def _prepare_git(root: Path, name: str, spec: GitSource, scratch_dir: Path, allow_dirty: bool,
                 cache_dir: Path | None) -> PreparedSource:
    st = _git_status(root, name, spec, cache_dir=cache_dir)
    if st.state is SourceState.IN_KIT:
        kit = gitarchive.find(cache_dir, spec.url, spec.commit)
        if kit is None:  # removed since the status was taken
            raise SourceError(f"the kit's archive of {name} disappeared from {cache_dir}",
                              fix="run `kforge sources kit install KIT` again")
        tree = _sdist.unpack(kit.path, scratch_dir)
        return PreparedSource(tree, spec.commit, "git", spec, note=f"from the kit archive {kit.path.name}")
    if st.state is SourceState.MISSING:
        raise SourceError(f"source {name} ({spec.path}) is missing", why=st.detail, fix=st.fix)
    if st.state in (SourceState.DIRTY, SourceState.WRONG_COMMIT) and not allow_dirty:
        raise SourceError(
            f"refusing to build {name}: {spec.path} is {st.state}",
            why=st.detail,
            fix=f"{st.fix}. To build it anyway (the build is then marked dirty), pass --allow-dirty",
        )
    path = root / spec.path
    tree = scratch_dir / Path(spec.path).name
    export_checkout(path, tree, include_untracked=allow_dirty and st.state is SourceState.DIRTY)
    dirty = st.state is not SourceState.PINNED
    return PreparedSource(tree, st.actual or spec.commit, "git", spec, dirty=dirty,
                          note=f"{st.state}: {st.detail}" if dirty else "")


def export_checkout(repo: Path, dest: Path, *, include_untracked: bool = False) -> None:
    """Copy the checkout's files (tracked files, nested submodules included) to ``dest``.

    The working-tree bytes are copied, so with ``--allow-dirty`` the local edits travel
    too. ``.git`` is not copied: the export is a plain tree, like an unpacked sdist.
    """
    uninit = [n.path for n in nested_states(repo) if not n.initialised]
    if uninit:
        raise SourceError(f"cannot export {repo}: nested submodule(s) not initialised: {', '.join(uninit)}",
                          why="the export would lack their files, and the build would fail later",
                          fix=f"git -C {repo} submodule update --init --recursive (or `kforge sources sync`)")
    out = run_git(["ls-files", "-z", "--cached", "--recurse-submodules"], cwd=repo).stdout
    files = [f for f in out.decode().split("\0") if f]
    if include_untracked:
        extra = run_git(["ls-files", "-z", "--others", "--exclude-standard"], cwd=repo).stdout
        files += [f for f in extra.decode().split("\0") if f]
    dest.mkdir(parents=True, exist_ok=True)
    for rel in files:
        src = repo / rel
        if not os.path.lexists(src):  # deleted in a dirty tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        elif src.is_file():
            shutil.copy2(src, target)


def _reset_dir(root: Path, scratch_dir: Path) -> None:
    externals = (root / "externals").resolve()
    resolved = scratch_dir.resolve()
    if resolved == root.resolve() or resolved in root.resolve().parents or resolved == Path.home().resolve():
        raise SourceError(f"refusing to use {scratch_dir} as a scratch directory", why="it would be emptied first",
                          fix="use a directory of its own, e.g. .kforge/work/<project>")
    if resolved == externals or externals in resolved.parents:
        raise SourceError(f"scratch directory {scratch_dir} is inside externals/",
                          why="builds never write into the pinned checkouts", fix="use a directory under .kforge/")
    if scratch_dir.exists():
        shutil.rmtree(scratch_dir)
    scratch_dir.mkdir(parents=True)


def _default_name(spec: Source) -> str:
    return spec.name if isinstance(spec, SdistSource) else Path(spec.path).name


# --------------------------------------------------------------------------- tree hashing


def tree_hash(path: Path, *, exclude: Sequence[str] = (".git",)) -> str:
    """sha256 over every file's relative path, executable bit, and bytes (symlinks by target).

    Two trees with the same hash are byte-for-byte the same; used to prove rollbacks.
    """
    h = hashlib.sha256()
    base = Path(path)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in exclude)
        rel_dir = Path(dirpath).relative_to(base)
        entries = sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))])
        if not filenames and not dirnames:
            h.update(b"D\0" + rel_dir.as_posix().encode() + b"\0")
        for fname in entries:
            full = Path(dirpath) / fname
            rel = (rel_dir / fname).as_posix().encode()
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                h.update(b"L\0" + rel + b"\0" + os.readlink(full).encode() + b"\0")
            else:
                mode = b"x" if st.st_mode & stat.S_IXUSR else b"-"
                h.update(b"F\0" + rel + b"\0" + mode + b"\0" + bytes.fromhex(sha256_file(full)))
    return h.hexdigest()
