"""Reproducible builds: the same source, patches, toolchain and variant give a byte-identical wheel.

Two things vary between otherwise identical builds, and kforge fixes both:

* **Timestamps** in the wheel's zip entries (the build backend, auditwheel and kforge's own wheel
  rewrites all honour ``SOURCE_DATE_EPOCH``). kforge sets it from the source itself, so it is the same
  for every build of one pin: a git pin's commit time, the last commit that touched a local source
  (``kernels/fmha``), or the newest file time inside a pinned sdist.
* **nvcc's random names**: each compile names its internal (file-local) device symbols with a random
  number, which lands in the fatbin. ``-frandom-seed`` replaces it; kforge appends
  ``-frandom-seed=<project>`` to ``NVCC_APPEND_FLAGS``, which nvcc itself reads on every call, whatever
  build system runs it.

A ``SOURCE_DATE_EPOCH`` the user set, or a ``-frandom-seed`` already in ``NVCC_APPEND_FLAGS``, wins.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kforge.config.source import GitSource, LocalSource, SdistSource, Source
from kforge.sources.upstream import PreparedSource

Git = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class Epoch:
    seconds: int | None  # None: no time could be read from the source (then none is set)
    origin: str  # what it was read from, for the log


def _git_time(args: list[str], run: Git) -> int | None:
    try:
        out = run(["git", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or "").strip()
    return int(text) if out.returncode == 0 and text.isdigit() else None


def source_epoch(root: Path, source: Source, prepared: PreparedSource, *, run: Git = subprocess.run) -> Epoch:
    """The source's own time, the same for every build of the same pin."""
    if isinstance(source, GitSource):
        t = _git_time(["-C", str(root / source.path), "show", "-s", "--format=%ct", source.commit], run)
        return Epoch(t, f"commit time of {source.commit[:12]}")
    if isinstance(source, LocalSource):
        t = _git_time(["-C", str(root), "log", "-1", "--format=%ct", "--", source.path], run)
        return Epoch(t, f"last commit touching {source.path}")
    if isinstance(source, SdistSource):
        times = [p.stat().st_mtime for p in prepared.tree.rglob("*") if p.is_file() and not p.is_symlink()]
        return Epoch(int(max(times)) if times else None, f"newest file in {source.name}=={source.version}")
    return Epoch(None, "unknown source kind")


def build_env(project: str, epoch: Epoch, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make the build reproducible, without overriding what the user set."""
    out: dict[str, str] = {}
    if epoch.seconds is not None and not environ.get("SOURCE_DATE_EPOCH"):
        out["SOURCE_DATE_EPOCH"] = str(epoch.seconds)
    flags = environ.get("NVCC_APPEND_FLAGS", "")
    if "-frandom-seed" not in flags:
        out["NVCC_APPEND_FLAGS"] = (flags + " " if flags.strip() else "") + f"-frandom-seed={project}"
    return out
