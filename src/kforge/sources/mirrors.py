"""Local git mirrors of upstream URLs: find the mirror for a URL, and the git options that use it.

Release builds run where GitHub is not reachable. A *mirror directory* holds bare (or
ordinary) clones of the upstream repositories, named after the URL they mirror; kforge
looks, in each directory, for the first of

* ``<owner>+<name>/repo`` (or ``<owner>+<name>/repo/.git``): the layout of ``/work/.mirror``,
* ``<owner>+<name>.git``,
* ``<owner>/<name>.git`` (the layout ``git clone --mirror URL DIR/<owner>/<name>.git`` makes),
* ``<name>.git``,

where ``<owner>/<name>`` are the last two parts of the URL's path (``.git`` stripped). The
directories come from ``--mirror DIR`` (repeatable), then ``$KFORGE_GIT_MIRROR`` (several
separated by ``os.pathsep``). A URL with no mirror is used as it is.

Git is pointed at a mirror with ``-c url.<mirror>.insteadOf=<url>`` on the command line,
so nothing is written to any ``.git/config``: a submodule's ``origin`` keeps its real URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV = "KFORGE_GIT_MIRROR"


@dataclass(frozen=True)
class Mirrors:
    """The mirror directories to search, in order (empty: use every URL as it is)."""

    dirs: tuple[Path, ...] = ()

    @classmethod
    def from_cascade(cls, flags: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Mirrors:
        """``--mirror`` flags first, then ``$KFORGE_GIT_MIRROR``; duplicates dropped, order kept."""
        environ = os.environ if environ is None else environ
        raw = list(flags or []) + [p for p in environ.get(ENV, "").split(os.pathsep) if p.strip()]
        seen: list[Path] = []
        for text in raw:
            path = Path(text).expanduser().resolve()
            if path not in seen:
                seen.append(path)
        return cls(tuple(seen))

    def __bool__(self) -> bool:
        return bool(self.dirs)

    def describe(self) -> str:
        return os.pathsep.join(str(d) for d in self.dirs) if self.dirs else "none"

    def find(self, url: str) -> Path | None:
        """The git directory mirroring ``url``, or None."""
        owner, name = url_owner_name(url)
        if not name:
            return None
        for d in self.dirs:
            candidates = [d / f"{owner}+{name}" / "repo", d / f"{owner}+{name}" / "repo" / ".git",
                          d / f"{owner}+{name}.git", d / owner / f"{name}.git", d / f"{name}.git"] if owner else \
                         [d / f"{name}.git"]
            for cand in candidates:
                if is_git_dir(cand):
                    return cand
        return None


def url_owner_name(url: str) -> tuple[str, str]:
    """``https://github.com/NVIDIA/cutlass.git`` -> ``("NVIDIA", "cutlass")``; also scp-like and file URLs."""
    text = url.strip().rstrip("/")
    text = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", "", text)  # scheme
    text = text.split("?", 1)[0]
    text = text.replace(":", "/")  # git@host:owner/name, host:port/owner/name
    parts = [p for p in text.split("/") if p]
    if not parts:
        return "", ""
    name = parts[-1].removesuffix(".git")
    if name == "repo" and len(parts) >= 2 and "+" in parts[-2]:  # a /work/.mirror-style path given as the URL
        owner, _, name = parts[-2].partition("+")
        return owner, name
    owner = parts[-2] if len(parts) >= 2 else ""
    return owner, name


def is_git_dir(path: Path) -> bool:
    """A bare repository or a ``.git`` directory (``HEAD`` and ``objects/`` present)."""
    return path.is_dir() and (path / "HEAD").is_file() and (path / "objects").is_dir()


def mirror_url(path: Path) -> str:
    """The URL git is sent to for a mirror directory (``file://``, so submodule clones accept it)."""
    return path.resolve().as_uri()


def git_config_args(mapping: Iterable[tuple[str, Path]]) -> list[str]:
    """``-c`` options sending each ``url`` to its mirror, and allowing the ``file`` transport for them.

    git refuses ``file://`` submodules by default since 2.38.1 (CVE-2022-39253); these are
    directories the user named as mirrors, so the ``file`` protocol is allowed for this call only.
    """
    args: list[str] = []
    for url, path in mapping:
        args += ["-c", f"url.{mirror_url(path)}.insteadOf={url}"]
    if args:
        args += ["-c", "protocol.file.allow=always"]
    return args


#: No mirror directories: every URL is used as it is.
NO_MIRRORS = Mirrors()
