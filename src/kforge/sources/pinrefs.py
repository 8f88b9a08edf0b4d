"""Is a git pin on a release line? Which branches and tags of its upstream contain the pinned commit.

A release engineer pins commits on a branch or a tag. A commit reachable only from
``refs/pull/*`` (a pull request, or GitHub's test merge of one) can vanish when the pull
request is rebased or closed, and a fresh ``git submodule update`` may not find it.
:func:`check` answers from a local repository (a mirror or the submodule checkout);
:func:`check_remote` from ``git ls-remote`` (exact branch/tag tips only).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kforge.sources.gittree import has_commit, run_git

#: Branch names that count as release lines, shown first.
_RELEASE_FIRST = ("main", "master")


@dataclass(frozen=True)
class PinReach:
    """Where a pinned commit can be reached from, in the repository that was asked."""

    commit: str
    repo: str  # the git directory or URL asked ("" when none could be)
    via: str  # "mirror" | "checkout" | "remote" | "none"
    present: bool  # the repository holds the commit (for "remote": it is a tip)
    branches: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # tags containing it; those pointing at it exactly come first
    exact_tags: tuple[str, ...] = ()
    other_refs: tuple[str, ...] = ()  # refs/pull/*, refs/changes/*, ...
    head_branch: str = ""  # the repository's default branch, when it contains the commit

    @property
    def released(self) -> bool:
        return bool(self.branches or self.tags)

    def summary(self) -> str:
        if self.via == "none":
            return "unknown: no mirror and no checkout to look in"
        if not self.present and self.via == "remote":
            return (f"the tip of no branch or tag of {self.repo} (its history was not fetched: give a mirror "
                    "or sync the checkout to look deeper)")
        if not self.present:
            return f"commit not in the {self.via} {self.repo}"
        if not self.released:
            refs = ", ".join(self.other_refs[:3]) + (f" (+{len(self.other_refs) - 3})" if len(self.other_refs) > 3 else "")
            return "on no branch and no tag" + (f"; only {refs}" if refs else "")
        parts = []
        if self.exact_tags:
            parts.append("tag " + ", ".join(self.exact_tags[:3]))
        shown_branches = _pick_branches(self.branches, self.head_branch)
        if shown_branches:
            more = len(self.branches) - len(shown_branches)
            parts.append("branch " + ", ".join(shown_branches) + (f" (+{more} more)" if more else ""))
        later_tags = [t for t in self.tags if t not in self.exact_tags]
        if later_tags:
            parts.append(f"in {len(later_tags)} later tag(s), e.g. {later_tags[0]}")
        return "; ".join(parts)


def _pick_branches(branches: Sequence[str], head: str) -> list[str]:
    first = [b for b in ([head] if head else []) + list(_RELEASE_FIRST) if b in branches]
    release = [b for b in branches if re.match(r"^(release|v\d+\.\d+)", b) and b not in first]
    picked = list(dict.fromkeys(first + release))[:3]
    return picked or list(branches[:2])


def check(repo: Path, commit: str, *, via: str) -> PinReach:
    """Branches and tags of ``repo`` (a bare mirror or a checkout) whose history contains ``commit``.

    In a checkout, branches are its remote-tracking refs (``refs/remotes/<remote>/<branch>``).
    """
    if not has_commit(repo, commit):
        return PinReach(commit, str(repo), via, present=False)
    out = run_git(["for-each-ref", "--contains", commit, "--format=%(refname)"], cwd=repo).stdout.decode()
    exact = run_git(["tag", "--points-at", commit], cwd=repo).stdout.decode().split()
    branches, tags, other = [], [], []
    for ref in out.split():
        if ref.startswith("refs/heads/"):
            branches.append(ref[len("refs/heads/"):])
        elif ref.startswith("refs/remotes/"):
            name = ref[len("refs/remotes/"):].split("/", 1)[-1]
            if name != "HEAD":
                branches.append(name)
        elif ref.startswith("refs/tags/"):
            tags.append(ref[len("refs/tags/"):])
        else:
            other.append(ref)
    head = run_git(["symbolic-ref", "--quiet", "--short", "HEAD"], cwd=repo, check=False).stdout.decode().strip()
    if via == "checkout":  # a checkout's HEAD is detached at the pin; its upstream default is origin/HEAD
        head = run_git(["symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD"], cwd=repo,
                       check=False).stdout.decode().strip().split("/", 1)[-1]
    branches = sorted(set(branches))
    tags = [t for t in exact] + sorted(t for t in set(tags) if t not in exact)
    return PinReach(commit, str(repo), via, True, tuple(branches), tuple(tags), tuple(exact), tuple(sorted(other)),
                    head if head in branches else "")


def check_remote(url: str, commit: str, *, git_args: Sequence[str] = ()) -> PinReach:
    """From ``git ls-remote``: the branches and tags whose tip *is* ``commit`` (history is not fetched)."""
    proc = run_git([*git_args, "ls-remote", "--heads", "--tags", url], check=False)
    if proc.returncode != 0:
        return PinReach(commit, url, "none", present=False)
    branches, tags = [], []
    for line in proc.stdout.decode().splitlines():
        sha, _, ref = line.partition("\t")
        if sha != commit:
            continue
        if ref.startswith("refs/heads/"):
            branches.append(ref[len("refs/heads/"):])
        elif ref.startswith("refs/tags/"):
            tags.append(ref[len("refs/tags/"):].removesuffix("^{}"))
    tags = sorted(set(tags))
    return PinReach(commit, url, "remote", bool(branches or tags), tuple(sorted(branches)), tuple(tags), tuple(tags))
