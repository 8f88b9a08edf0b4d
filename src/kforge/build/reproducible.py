"""Reproducible builds: the same source, patches, toolchain and variant give a byte-identical wheel.

Three things vary between otherwise identical builds, and kforge fixes all three:

* **Timestamps** in the wheel's zip entries (the build backend, auditwheel and kforge's own wheel
  rewrites all honour ``SOURCE_DATE_EPOCH``). kforge sets it from the source itself, so it is the same
  for every build of one pin: a git pin's commit time, the last commit that touched a local source
  (``kernels/fmha``), or the newest file time inside a pinned sdist.
* **nvcc's random names**: each compile names its internal (file-local) device symbols with a random
  number, which lands in the fatbin. ``-frandom-seed`` replaces it; kforge appends
  ``-frandom-seed=<project>`` to ``NVCC_APPEND_FLAGS``, which nvcc itself reads on every call, whatever
  build system runs it.
* **The folder the build ran in**: compilers write the paths of the sources they read into the binary
  (``__FILE__`` in ``assert``, debug info, device line info, the fatbin's name for each image), and the
  scratch tree lies under the checkout (``<root>/.kforge/work/<target>``), so two clones in two folders
  gave two wheels. The plan maps the checkout's folder to :data:`MAPPED_ROOT` (:func:`path_maps`):

  - host compilers get ``-ffile-prefix-map=<root>=/kforge`` through ``CFLAGS`` and ``CXXFLAGS`` (CMake,
    setuptools and torch's ``BuildExtension`` read them), and nvcc's host passes get it through
    ``-Xcompiler`` in ``NVCC_APPEND_FLAGS`` (``__FILE__`` in device code is expanded there too);
  - device code: nvcc has no prefix map of its own, and cicc names source files after the line
    markers of the host preprocessor's output, which no GCC option maps. kforge's nvcc wrapper
    (:mod:`kforge.cuda.nvccwrap`) gives nvcc a host-compiler shim that applies the same map to those line
    markers (and the CUDA toolkit's folder to ``/kforge-cuda``, where ptxas would read the headers' times for
    ``-lineinfo``), passes input files under the root as paths relative to the step's folder (the fatbin
    names each image after nvcc's input argument), and gives cudafe++ the input's mapped path (it
    hashes the path into the names of internal-linkage device symbols, ``_INTERNAL_<hash>_``, which
    end up in the PTX and cubin). So it needs the wrapper: the plan says
    when it is not installed (arch enforcement ``off``, cibuildwheel, Windows).

  A root whose path holds a space, a comma or ``=`` is not mapped (no flag could carry it); the plan says so.

A ``SOURCE_DATE_EPOCH`` the user set, a ``-frandom-seed`` already in ``NVCC_APPEND_FLAGS``, or a
``-ffile-prefix-map``/``-fdebug-prefix-map`` already in the variable kforge would add one to, wins.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


#: What the checkout's folder is called inside the binaries (the same in every clone).
MAPPED_ROOT = "/kforge"
_PREFIX_FLAGS = ("-ffile-prefix-map", "-fdebug-prefix-map", "-fmacro-prefix-map")


@dataclass(frozen=True)
class PathMap:
    """One prefix map: compilers record paths under ``old`` as if under ``new``."""

    old: str
    new: str

    @property
    def flag(self) -> str:
        return f"-ffile-prefix-map={self.old}={self.new}"


@dataclass(frozen=True)
class Reproducibility:
    """The plan's part of a reproducible build: what every build of this plan gets, whatever folder it runs in.

    ``SOURCE_DATE_EPOCH`` is read from the source when it is on disk (:func:`source_epoch`); the rest is decided here.
    """

    seed: str  # -frandom-seed=<seed> for nvcc
    path_maps: tuple[PathMap, ...]  # () when the root cannot be mapped (see ``unmapped``)
    platform_os: str
    device_maps: bool  # kforge's nvcc wrapper is installed, so device code gets the maps too
    unmapped: str = ""  # why there are no maps (for the plan)
    no_device: str = "kforge's nvcc wrapper is not installed for this build"  # why device code is not mapped
    host_vars: tuple[str, ...] = field(default=("CFLAGS", "CXXFLAGS"))

    @property
    def host_flags(self) -> tuple[str, ...]:
        return tuple(m.flag for m in self.path_maps)

    @property
    def nvcc_flags(self) -> tuple[str, ...]:
        """What kforge appends to ``NVCC_APPEND_FLAGS``: the seed, and the maps for nvcc's host passes."""
        return (f"-frandom-seed={self.seed}", *(f"-Xcompiler={f}" for f in self.host_flags))

    def describe(self) -> list[str]:
        """The plan's lines (after ``reproducible``)."""
        lines = ["SOURCE_DATE_EPOCH from the source's own time (the build log names it); "
                 f"NVCC_APPEND_FLAGS += {self.nvcc_flags[0]}"]
        if not self.path_maps:
            lines.append(f"paths not mapped: {self.unmapped}")
            return lines
        maps = ", ".join(f"{m.old} -> {m.new}" for m in self.path_maps)
        lines.append(f"paths {maps}: {', '.join(self.host_vars)} += {' '.join(self.host_flags)}")
        lines.append(f"NVCC_APPEND_FLAGS += {' '.join(self.nvcc_flags[1:])}")
        lines.append("device code: " + ("kforge's nvcc wrapper maps the preprocessor's line markers (the CUDA "
                                        "toolkit's folder -> /kforge-cuda too), the fatbin's file names and "
                                        "cudafe++'s module ids" if self.device_maps else
                                        f"not mapped ({self.no_device})"))
        return lines

    def to_dict(self) -> dict[str, object]:
        return {"seed": self.seed, "path_maps": [[m.old, m.new] for m in self.path_maps],
                "host_flags": {v: list(self.host_flags) for v in self.host_vars},
                "nvcc_append_flags": list(self.nvcc_flags), "device_maps": self.device_maps,
                "unmapped": self.unmapped or None}


def path_maps(root: Path) -> tuple[tuple[PathMap, ...], str]:
    """The checkout's folder mapped to :data:`MAPPED_ROOT`, or ``()`` and why not."""
    old = str(root)
    bad = [c for c in (" ", ",", "=", "\t", "\n", '"', "'") if c in old]
    if bad:
        return (), f"the root {old!r} holds {bad[0]!r}, which no -ffile-prefix-map flag in NVCC_APPEND_FLAGS can carry"
    return (PathMap(old, MAPPED_ROOT),), ""


def plan_reproducibility(project: str, root: Path, platform_os: str, *, device: bool,
                         no_device: str = "") -> Reproducibility:
    """``device``: kforge's nvcc wrapper runs in this build (``no_device`` says why not)."""
    if platform_os == "windows":  # cl.exe has no -ffile-prefix-map (and nvcc passes -Xcompiler to it)
        return Reproducibility(seed=project, path_maps=(), platform_os=platform_os, device_maps=False,
                               unmapped="MSVC has no -ffile-prefix-map")
    maps, why = path_maps(root)
    return Reproducibility(seed=project, path_maps=maps, platform_os=platform_os, device_maps=device and bool(maps),
                           unmapped=why, **({"no_device": no_device} if no_device else {}))


def wrapper_reach(wrapper: bool, backend: str, enforce_mode: str) -> dict[str, bool | str]:
    """The ``device`` and ``no_device`` of :func:`plan_reproducibility`: whether kforge's nvcc wrapper, which maps
    device code's paths, runs in the build (``ArchEnforcement.wrapper``, the plan's decision), and why not."""
    if wrapper:
        return {"device": True}
    if backend == "cibuildwheel":
        return {"device": False, "no_device": "the cibuildwheel backend builds in its container, at /project in every "
                                              "Linux build; kforge's nvcc wrapper does not reach it"}
    if enforce_mode == "off":
        return {"device": False, "no_device": "arch_enforce = off: kforge's nvcc wrapper is not installed"}
    return {"device": False, "no_device": "kforge's nvcc wrapper does not run on this platform"}


def _maps_the_root(flags: str, repro: Reproducibility) -> bool:
    """A prefix map of the plan's own folder is already in ``flags`` (the user's wins); maps of other folders
    combine with kforge's (conda's ``-fdebug-prefix-map=$SRC_DIR=...``, say), so they don't stop it."""
    return any(f"{flag}={m.old}=" in flags for flag in _PREFIX_FLAGS for m in repro.path_maps)


def build_env(repro: Reproducibility, epoch: Epoch, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make the build reproducible, without overriding what the user set."""
    out: dict[str, str] = {}
    if epoch.seconds is not None and not environ.get("SOURCE_DATE_EPOCH"):
        out["SOURCE_DATE_EPOCH"] = str(epoch.seconds)
    flags = environ.get("NVCC_APPEND_FLAGS", "")
    add = [f for f in repro.nvcc_flags if not (f.startswith("-frandom-seed") and "-frandom-seed" in flags)
           and not (f.startswith("-Xcompiler=") and _maps_the_root(flags, repro))]
    if add:
        out["NVCC_APPEND_FLAGS"] = " ".join(([flags.strip()] if flags.strip() else []) + add)
    for var in repro.host_vars if repro.path_maps else ():
        have = environ.get(var, "")
        if not _maps_the_root(have, repro):
            out[var] = " ".join(([have.strip()] if have.strip() else []) + list(repro.host_flags))
    return out
