"""What forge.toml pins as a project's source: a git submodule, an sdist, or a local tree (plain data)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GitSource:
    """An upstream git repository vendored as a submodule at ``path`` (relative to the root)."""

    path: str
    url: str
    commit: str  # 40 hex


@dataclass(frozen=True)
class SdistSource:
    """An sdist from a package index, pinned by version and sha256."""

    name: str
    version: str
    sha256: str
    index_url: str | None = None


@dataclass(frozen=True)
class LocalSource:
    """Our own code under the monorepo (``kernels/<name>``)."""

    path: str


Source = GitSource | SdistSource | LocalSource
