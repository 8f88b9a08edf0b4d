"""Git plumbing for pinned trees: run git, list a commit's nested submodules, and check their state.

The bottom layer under :mod:`kforge.sources.upstream`, :mod:`kforge.sources.pinrefs` and :mod:`kforge.sources.kit`:
it knows git, not forge.toml.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kforge.errors import SourceError


def run_git(args: Sequence[str], *, cwd: Path | None = None, check: bool = True, input: bytes | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run git; a failure with ``check`` raises :class:`SourceError` with the command and output tail."""
    cmd = ["git", *args]
    try:
        proc = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, env=env)
    except FileNotFoundError as exc:
        raise SourceError("git is not installed", fix="install git and retry") from exc
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()[-8:]
        shown = [a for a in cmd if not a.startswith("url.") and a != "-c" and not a.startswith("protocol.file")]
        raise SourceError(
            f"`{' '.join(shown)}` failed with exit code {proc.returncode}" + (f" in {cwd}" if cwd else ""),
            why="\n".join(tail) or None,
        )
    return proc


def has_commit(repo: Path, commit: str) -> bool:
    """True if the repository (a checkout or a bare git directory) holds ``commit``."""
    return run_git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo, check=False).returncode == 0


@dataclass(frozen=True)
class Submodule:
    """A submodule a commit records: its path, the URL its ``.gitmodules`` gives, and the pinned commit."""

    path: str
    url: str
    commit: str


def submodules_at(repo: Path, commit: str) -> tuple[Submodule, ...]:
    """The submodules recorded in ``commit`` (gitlinks in its tree, URLs from its ``.gitmodules``).

    Reads git objects only, so it works on bare mirrors. A gitlink without a ``.gitmodules``
    entry gets an empty URL (git itself cannot clone it either).
    """
    tree = run_git(["ls-tree", "-r", "-z", commit], cwd=repo).stdout.decode(errors="replace")
    links = {}
    for entry in tree.split("\0"):
        meta, _, path = entry.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[0] == "160000":
            links[path] = parts[2]
    if not links:
        return ()
    urls: dict[str, str] = {}
    proc = run_git(["config", "--blob", f"{commit}:.gitmodules", "-z", "--get-regexp", r"^submodule\..*\.(path|url)$"],
                   cwd=repo, check=False)
    by_name: dict[str, dict[str, str]] = {}
    for item in proc.stdout.decode(errors="replace").split("\0"):
        key, _, value = item.partition("\n")
        if not key:
            continue
        name, _, field = key[len("submodule."):].rpartition(".")
        by_name.setdefault(name, {})[field] = value
    for fields in by_name.values():
        if "path" in fields:
            urls[fields["path"]] = fields.get("url", "")
    return tuple(Submodule(path, urls.get(path, ""), sha) for path, sha in sorted(links.items()))


@dataclass(frozen=True)
class NestedState:
    """One line of ``git submodule status --recursive``: ``-`` not initialised, ``+`` other commit, ``U`` conflict."""

    path: str  # relative to the checkout it was asked about
    flag: str  # "-", "+", "U" or " "
    commit: str

    @property
    def initialised(self) -> bool:
        return self.flag != "-"


def nested_states(checkout: Path) -> tuple[NestedState, ...]:
    """The state of every submodule inside ``checkout``, recursively (``()`` when it has none).

    Submodules inside an uninitialised one cannot be seen, so a ``-`` line may hide more.
    """
    proc = run_git(["submodule", "status", "--recursive"], cwd=checkout, check=False)
    if proc.returncode != 0:
        raise SourceError(f"`git submodule status --recursive` failed in {checkout}",
                          why=proc.stderr.decode(errors="replace").strip()[-400:] or None,
                          fix=f"inspect it with `git -C {checkout} submodule status --recursive`")
    states = []
    for line in proc.stdout.decode(errors="replace").splitlines():
        if len(line) < 42:
            continue
        flag, sha, rest = line[0], line[1:41], line[42:]
        path = rest.split(" (", 1)[0].strip()
        states.append(NestedState(path, flag, sha))
    return tuple(states)
