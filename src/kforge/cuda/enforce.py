"""Arch enforcement around a build: the plan's promise, the nvcc wrapper's install, and what it rewrote.

* :func:`plan_enforcement` (called by :func:`kforge.plan.make_plan`): the mode for a project
  (forge.toml's ``arch_enforce = "on" | "check" | "off"``), what every binary will hold
  (SASS and PTX, from the plan's ``-gencode`` flags), and a scan of the project's build
  scripts for hard-coded arch flags and ``--threads``, so ``kforge plan`` says before any
  compile that the wrapper will have to rewrite them.
* :func:`install`: write the wrapper (:mod:`kforge.cuda.nvccwrap`) into the work dir and point
  every way a build reaches nvcc at it: ``PATH``, a shadow ``CUDA_HOME`` whose ``bin/nvcc`` is
  the wrapper (everything else links to the real toolkit), ``PYTORCH_NVCC``, ``CUDACXX``
  (which CMake reads for ``CMAKE_CUDA_COMPILER``).
* :func:`summarize`: the wrapper's log, folded into one summary per build for the build log
  and report.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kforge
from kforge.cuda.nvccwrap import MODES, Config, Policy, policy_from_flags
from kforge.fsutil import atomic_write_text, prepend_path, write_executable

#: Build scripts the plan scans for hard-coded arch flags (up to two folders below the build dir).
SCRIPT_NAMES = ("setup.py", "CMakeLists.txt", "build.py", "pyproject.toml", "meson.build")
SKIP_DIRS = frozenset({"third_party", "3rdparty", "cutlass", "external", "externals", "tests", "test", "docs",
                       "examples", "benchmarks", "build", "dist", ".git", "node_modules"})
_HARDCODED = re.compile(
    r"""(['"](-gencode|--generate-code|-arch|--gpu-architecture|-code|--gpu-code|--threads|-t)\b"""
    r"""|-gencode[= ]+['"]?arch=|arch=compute_\d)"""
)
#: In CMake files: an architecture list set in the file itself.
_HARDCODED_CMAKE = re.compile(r"""CUDA_ARCHITECTURES\s+['"]?\d""")

#: A CMake cache default (``set(CMAKE_CUDA_ARCHITECTURES 90a CACHE STRING ...)``) yields to the plan's -D: not a hard-code.
_DEFAULT_ONLY = re.compile(r"\bCACHE\s+(STRING|INTERNAL)\b")


@dataclass(frozen=True)
class ArchEnforcement:
    """The plan's arch enforcement: mode, what binaries hold, what the scan found."""

    mode: str  # on | check | off
    reason: str  # why this mode (forge.toml, or the backend/platform cannot run the wrapper)
    flags: tuple[str, ...]  # the plan's -gencode flags, which the wrapper enforces
    threads: int | None
    hardcoded: tuple[str, ...] = ()  # "setup.py:12: -gencode arch=compute_75,code=sm_75" ...
    scanned: str = ""  # what was scanned, or why nothing was
    wrapper: bool = False  # the build runs behind kforge's nvcc wrapper (a POSIX host, not a container)
    ptxas_asked: int = 1  # ptxas threads the project (or --ptxas-threads) asked for
    ptxas_from: str = ""  # where that came from

    @property
    def ptxas_threads(self) -> int | None:
        """N > 1 where the wrapper gives every device step ptxas ``--split-compile=N`` (it rewrites: mode ``on``)."""
        return self.ptxas_asked if self.ptxas_asked > 1 and self.wrapper and self.mode == "on" else None

    @property
    def policy(self) -> Policy:
        return policy_from_flags(self.flags, mode=self.mode, threads=self.threads, ptxas_threads=self.ptxas_threads)

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(a.sass for a in self.policy.archs if a.sass)

    @property
    def ptx(self) -> tuple[str, ...]:
        return tuple(a.virtual for a in self.policy.archs if a.ptx)

    @property
    def exact(self) -> bool:
        """The doctor holds the binaries to exactly :attr:`sass` (and :attr:`ptx`, see :attr:`exact_ptx`)."""
        return self.mode in ("on", "check")

    @property
    def exact_ptx(self) -> bool:
        """PTX is judged too only where the wrapper rewrites: whether an upstream embeds PTX is its own packaging
        choice (FA2 embeds none, CMake's ``90`` embeds it), which only the wrapper can bring in line with the plan."""
        return self.mode == "on"

    def contents(self) -> str:
        """``SASS sm_90, PTX compute_90``: what every CUDA binary of the wheel will hold."""
        parts = [f"SASS {' '.join(self.sass)}" if self.sass else "no SASS"]
        if self.ptx:
            parts.append(f"PTX {' '.join(self.ptx)}" + ("" if self.exact_ptx or not self.exact else
                                                        " if the upstream embeds PTX (not judged without the wrapper)"))
        return ", ".join(parts)

    def describe(self) -> str:
        """One line for ``kforge plan``."""
        why = f" ({self.reason})" if self.reason else ""
        if self.mode == "off":
            return f"off{why}: the upstream's own flags decide; the doctor checks that no arch is missing"
        will = "rewrites" if self.mode == "on" else "only reports (check mode)"
        head = f"{self.mode}{why}: kforge's nvcc wrapper {will} other arch flags"
        if self.threads is not None:
            head += f" and --threads (to {self.threads})"
        if self.hardcoded:
            verb = "will rewrite" if self.mode == "on" else "would rewrite"
            more = f" (+{len(self.hardcoded) - 3} more)" if len(self.hardcoded) > 3 else ""
            head += (f"; the build scripts write their own arch flags, which it {verb} where they differ: "
                     + "; ".join(self.hardcoded[:3]) + more)
        elif self.scanned:
            head += f"; {self.scanned}"
        return head

    def ptxas_line(self) -> str:
        """The plan's ``ptxas`` line (printed where more than one thread was asked for)."""
        if self.ptxas_threads:
            return (f"--split-compile={self.ptxas_threads} in every device step ({self.ptxas_from}; kforge's nvcc wrapper): "
                    f"ptxas compiles a unit's functions on up to {self.ptxas_threads} threads, the SASS is the same as with "
                    "one; each cubin's ptxas note records it (the doctor checks it)")
        why = self.reason if self.reason and self.mode != "on" else (
            f"arch enforcement is {self.mode}" if self.mode != "on" else "the wrapper does not reach this build")
        return f"1 thread: {self.ptxas_from} asks for {self.ptxas_asked}, which needs kforge's nvcc wrapper, and {why}"

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "reason": self.reason, "sass": list(self.sass), "ptx": list(self.ptx),
                "exact": self.exact, "exact_ptx": self.exact_ptx,
                "threads": self.threads, "hardcoded": list(self.hardcoded), "scanned": self.scanned,
                "wrapper": self.wrapper, "ptxas_threads": self.ptxas_threads}


def plan_enforcement(mode: str, flags: Sequence[str], threads: int | None, *, backend: str, platform_os: str,
                     scripts_dir: Path | None, scan_note: str = "", ptxas_threads: int | None = None,
                     ptxas_from: str = "") -> ArchEnforcement:
    """The plan's enforcement for a project declared with ``arch_enforce = mode``.

    The wrapper is a POSIX script in the build's work dir: the cibuildwheel backend (a container)
    and Windows builds cannot run it, so those are held to ``check``: the doctor still judges the
    binaries exactly.
    """
    if mode not in MODES:
        raise ValueError(mode)
    reason = "forge.toml" if mode != "on" else ""
    if mode == "on" and backend == "cibuildwheel":
        mode, reason = "check", "the cibuildwheel backend builds in a container the wrapper does not reach"
    elif mode == "on" and platform_os == "windows":
        mode, reason = "check", "the wrapper is a POSIX script; on Windows the doctor checks the archs exactly"
    found: tuple[str, ...] = ()
    scanned = scan_note
    if mode != "off" and scripts_dir is not None:
        if scripts_dir.is_dir() and any(scripts_dir.iterdir()):
            found = scan_build_scripts(scripts_dir)
            scanned = scanned or f"found no hard-coded arch flags in {scripts_dir.name}'s build scripts"
        else:
            scanned = f"{scripts_dir} is not checked out: the build log lists what the wrapper rewrote"
    wrapper = mode != "off" and backend != "cibuildwheel" and platform_os != "windows"
    return ArchEnforcement(mode=mode, reason=reason, flags=tuple(flags), threads=threads, hardcoded=found,
                           scanned=scanned, wrapper=wrapper, ptxas_asked=ptxas_threads or 1, ptxas_from=ptxas_from)


def scan_build_scripts(tree: Path, *, depth: int = 2, limit: int = 8) -> tuple[str, ...]:
    """``file:line: text`` for each line of a build script that hard-codes arch flags or ``--threads``."""
    tree = Path(tree)
    found: list[str] = []
    for path in _scripts(tree, depth):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines, 1):
            code = line.split("#", 1)[0] if path.suffix in (".py", ".toml", ".txt", ".cmake", ".build") else line
            cmake = path.name == "CMakeLists.txt" or path.suffix == ".cmake"
            if (_HARDCODED.search(code) or (cmake and _HARDCODED_CMAKE.search(code))) and not _DEFAULT_ONLY.search(code):
                text = " ".join(code.split())
                found.append(f"{path.relative_to(tree).as_posix()}:{n}: {text[:90]}")
                if len(found) >= limit:
                    return tuple(found)
    return tuple(found)


def _scripts(tree: Path, depth: int) -> list[Path]:
    out: list[Path] = []
    stack = [(tree, 0)]
    while stack:
        folder, level = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                if level < depth and entry.name not in SKIP_DIRS and not entry.name.startswith("."):
                    stack.append((entry, level + 1))
            elif entry.name in SCRIPT_NAMES or entry.suffix == ".cmake":
                out.append(entry)
    return sorted(out)


# ---------------------------------------------------------------------------- install into a build


@dataclass(frozen=True)
class WrapperSetup:
    env: Mapping[str, str]  # to add to the build's environment
    wrapper: Path  # bin/nvcc of the shadow CUDA home (runs the launcher, if any)
    direct: Path  # the same without the launcher, for CUDACXX (CMake adds its own launcher)
    cuda_home: Path  # the shadow CUDA home
    log: Path  # the wrapper's JSON-lines log


_SCRIPT = """#!/bin/sh
# Generated by kforge: the plan's archs and nvcc threads, enforced (mode {mode}); see kforge.cuda.nvccwrap.
exec {python} -I {boot} {config} "$@"
"""

_BOOT = """# Written by kforge: run kforge.cuda.nvccwrap with the sys.path of the kforge that wrote it.
import sys
sys.path[:0] = {paths!r}
from kforge.cuda.nvccwrap import main
sys.exit(main())
"""


def boot_file(directory: Path) -> Path:
    """The boot file carries this interpreter's sys.path: a build under pip's isolation cannot import kforge."""
    paths = [str(Path(kforge.__file__).resolve().parents[1])] + [p for p in sys.path if p]
    boot = Path(directory) / "kforge_nvccwrap_boot.py"
    atomic_write_text(boot, _BOOT.format(paths=list(dict.fromkeys(paths))))
    return boot


def write_wrapper(path: Path, config: Config, boot: Path, *, python: str = sys.executable) -> Path:
    """One wrapper file. The configuration is written into it, so a compiler cache that hashes the
    compiler's content (ccache's ``compilercheck=content``) sees a changed plan as a changed compiler."""
    text = _SCRIPT.format(mode=config.policy.mode, python=shlex.quote(python), boot=shlex.quote(str(boot)),
                          config=shlex.quote(config.to_json()))
    return write_executable(path, text)


def install(enforcement: ArchEnforcement, *, nvcc: Path, cuda_home: Path, dest: Path, launcher: Path | None = None,
            short_deps: bool = False, env: Mapping[str, str] | None = None,
            path_maps: Sequence[tuple[str, str]] = ()) -> WrapperSetup:
    """Write the wrapper under ``dest`` and return the environment that routes every nvcc call through it.

    ``path_maps`` ((old, new) folders: the plan's, kforge.build.reproducible) make it map device code's paths too."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    boot = boot_file(dest)
    log = dest / "rewrites.jsonl"
    log.unlink(missing_ok=True)
    policy = enforcement.policy
    maps = tuple((str(o), str(n)) for o, n in path_maps)
    mapping = {"path_maps": maps, "shim_dir": str(dest / "hostcc"), "boot": str(boot)} if maps else {}
    config = Config(policy=policy, nvcc=str(nvcc), launcher=str(launcher) if launcher else None, log=str(log),
                    short_deps=short_deps, **mapping)
    shadow = _shadow_home(Path(cuda_home), dest / "cuda")
    wrapper = write_wrapper(shadow / "bin" / "nvcc", config, boot)
    direct = write_wrapper(dest / "direct" / "nvcc",
                           Config(policy=policy, nvcc=str(nvcc), launcher=None, log=str(log), **mapping), boot)
    path = (env or {}).get("PATH", os.environ.get("PATH", ""))
    out = {
        "CUDA_HOME": str(shadow),
        "CUDA_PATH": str(shadow),
        "PATH": prepend_path(shadow / "bin", path),
        "PYTORCH_NVCC": str(wrapper),
        "CUDACXX": str(direct),
        "CUDA_NVCC_EXECUTABLE": str(wrapper),  # FindCUDA.cmake's name
    }
    return WrapperSetup(env=out, wrapper=wrapper, direct=direct, cuda_home=shadow, log=log)


def _shadow_home(real: Path, shadow: Path) -> Path:
    """A CUDA home whose ``bin/nvcc`` will be the wrapper and whose every other entry links to ``real``.

    nvcc itself is always run by its real path, so it finds its own toolkit (``nvcc.profile``).
    """
    real = real.resolve()
    (shadow / "bin").mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir():
        if entry.name == "bin":
            continue
        _link(shadow / entry.name, entry)
    for entry in (real / "bin").iterdir():
        if entry.name != "nvcc":
            _link(shadow / "bin" / entry.name, entry)
    return shadow


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        if link.is_symlink() and os.readlink(link) == str(target):
            return
        link.unlink()
    link.symlink_to(target)


# ---------------------------------------------------------------------------- after the build


@dataclass(frozen=True)
class RewriteGroup:
    asked: tuple[str, ...]
    got: tuple[str, ...]
    count: int
    example: str  # one input file


@dataclass(frozen=True)
class EnforcementSummary:
    mode: str
    groups: tuple[RewriteGroup, ...]  # distinct arch rewrites, most frequent first
    threads: tuple[tuple[int | None, int | None, int], ...]  # (asked, got, count)
    steps: int  # nvcc steps logged with an arch or --threads rewrite
    ptxas: tuple[tuple[int, int], ...] = ()  # (the plan's ptxas --split-compile N, device steps that got it)

    def lines(self) -> list[str]:
        verb = "rewrote" if self.mode == "on" else "would rewrite (check mode)"
        split = [f"ptxas threads: {count} device step(s) got ptxas --split-compile={n} (the plan's ptxas_threads)"
                 for n, count in self.ptxas]
        if not self.steps:
            return [f"arch enforcement ({self.mode}): every nvcc step already asked for the plan's archs", *split]
        out = []
        for g in self.groups:
            if set(g.asked) != set(g.got):
                out.append(f"arch enforcement: {verb} {g.count} nvcc step(s) that asked for {' '.join(g.asked)} "
                           f"to {' '.join(g.got)} (e.g. {g.example})")
        for asked, got, count in self.threads:
            out.append(f"arch enforcement: {verb} --threads {asked} to {got} in {count} nvcc step(s)")
        return out + split

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "steps": self.steps,
            "archs": [{"asked": list(g.asked), "got": list(g.got), "count": g.count, "example": g.example}
                      for g in self.groups if set(g.asked) != set(g.got)],
            "threads": [{"asked": a, "got": b, "count": n} for a, b, n in self.threads],
            "ptxas_threads": [{"threads": n, "count": c} for n, c in self.ptxas],
        }


def summarize(log: Path, mode: str) -> EnforcementSummary:
    """Fold the wrapper's per-step log into distinct rewrites (a missing log: nothing was rewritten)."""
    groups: Counter[tuple[tuple[str, ...], tuple[str, ...]]] = Counter()
    examples: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
    threads: Counter[tuple[int | None, int | None]] = Counter()
    ptxas: Counter[int] = Counter()
    steps = 0
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("ptxas_threads"):
            ptxas[int(rec["ptxas_threads"])] += 1
        key = (tuple(rec.get("asked", ())), tuple(rec.get("got", ())))
        asked, got = (rec.get("threads") or [None, None])[:2]
        rewrote = False
        if set(key[0]) != set(key[1]):
            groups[key] += 1
            inputs = rec.get("inputs") or ["?"]
            examples.setdefault(key, Path(inputs[0]).name)
            rewrote = True
        if asked is not None and asked != got:
            threads[(asked, got)] += 1
            rewrote = True
        steps += rewrote
    return EnforcementSummary(
        mode=mode,
        groups=tuple(RewriteGroup(a, g, n, examples[(a, g)]) for (a, g), n in groups.most_common()),
        threads=tuple((a, g, n) for (a, g), n in threads.most_common()),
        steps=steps,
        ptxas=tuple(sorted(ptxas.items())),
    )
