"""Build backends: one Protocol, one sibling module per way of building.

* :mod:`~kforge.backends.native`: a PEP 517 build of the prepared tree with ``pip wheel``
  (no build isolation when the project needs the installed torch).
* :mod:`~kforge.backends.cibuildwheel`: the plan rendered as ``CIBW_*`` configuration, then
  cibuildwheel (manylinux_2_28 container with the CUDA toolkit; Windows on a Windows host).
* :mod:`~kforge.backends.cmake`: configure, build, install and pack a standalone C library.

Each backend takes a :class:`BuildRequest` (the plan plus where things go) and returns a
frozen :class:`BuildResult`. The pipeline picks one with :func:`get_backend`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from kforge.build.measure import UnitMeasure
from kforge.errors import BuildError, did_you_mean
from kforge.plan import Plan

__all__ = ["BACKENDS", "Backend", "BuildRequest", "BuildResult", "get_backend"]


@dataclass(frozen=True)
class BuildRequest:
    plan: Plan
    tree: Path  # the prepared (patched) source tree's build dir (plan.build_dir already joined)
    out_dir: Path  # where the built wheel (or the packed install prefix) must land
    work_dir: Path  # scratch for build dirs and logs (a fresh dir per build)
    env: Mapping[str, str]  # os.environ merged with plan.env (+ toolchain PATH), ready to use
    python: str  # the interpreter to build with (sys.executable by default)
    forge_pythons: tuple[str, ...]  # forge.toml's python versions (for CIBW_BUILD)
    progress: bool = True  # show live progress (units done of total, elapsed, ETA)
    ctest: bool = False  # cmake: run ctest on the build tree before packing


@dataclass(frozen=True)
class BuildResult:
    artifact: Path  # the wheel (native, cibuildwheel) or the packed install prefix (cmake)
    kind: str  # "wheel" | "cmake-install"
    seconds: float
    peak_rss: int  # bytes: the largest single process of the build (0 where it cannot be measured)
    ninja_logs: tuple[Path, ...]  # every .ninja_log the build wrote (for the build report)
    log: Path  # full combined output of the build
    retried_with_jobs: int | None  # set if the OOM retry ran (with how many jobs)
    units: tuple[UnitMeasure, ...] = ()  # per compile unit: time and peak RSS, where wrapped
    artifacts: tuple[Path, ...] = ()  # every artifact (cibuildwheel: one wheel per Python); artifact is the first
    repaired: bool = False  # the wheels were already repaired by the backend (cibuildwheel's repair command)


@runtime_checkable
class Backend(Protocol):
    name: str

    def build(self, request: BuildRequest) -> BuildResult: ...


#: backend name -> (module, class)
BACKENDS: Mapping[str, tuple[str, str]] = {
    "native": ("kforge.backends.native", "NativeBackend"),
    "cibuildwheel": ("kforge.backends.cibuildwheel", "CibuildwheelBackend"),
    "cmake": ("kforge.backends.cmake", "CmakeBackend"),
}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; an unknown name is a :class:`BuildError` with a did-you-mean."""
    if name not in BACKENDS:
        raise BuildError(
            f"'{name}' is not a build backend{did_you_mean(name, BACKENDS)}",
            why=f"kforge has these backends: {', '.join(BACKENDS)}",
            fix="set backend in forge.toml or pass --backend with one of those",
        )
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
