"""A CPython for kforge's build image that Debian's suite does not ship: the host's, with its C runtime.

Debian bullseye has CPython 3.9 only, and a torch-ABI wheel needs the Python it will run under (3.12 on
the GPU host). Registries other than PyPI and Debian may be unreachable, so there is no CPython 3.12 to
download; the host's CPython (pyenv's, uv's or the system's) is carried into the image instead:

1. :func:`find_host_python` finds a CPython ``X.Y`` here and asks it for its prefix;
2. :func:`stage_host_python` copies that prefix (without ``site-packages`` and the test suite) and every
   shared library its binaries load, the host's glibc and dynamic loader included, into a cache folder;
3. the image's provisioning (:func:`install_script`) lays the prefix at ``/opt/python/cpXY-cpXY`` with
   the libraries in ``lib/kforge-runtime`` and points its ELF files there (``patchelf``: interpreter,
   ``DT_RPATH``, and the glibc pieces as ``DT_NEEDED`` so that none is ever taken from the image's older
   glibc in the same process).

Only that interpreter runs on the carried glibc. The compilers, ``nvcc`` and the linker are the image's,
and extensions link against the image's glibc, so the wheel's platform tag is the image's (bullseye:
``manylinux_2_31``). :func:`install_script` also rewrites the host prefix in the interpreter's build
configuration (``_sysconfigdata``), so that extensions get no ``-rpath`` to a host folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kforge.errors import ToolchainError
from kforge.fsutil import atomic_write_text, sha256_file

Runner = Callable[..., subprocess.CompletedProcess]

#: glibc's libraries besides libc: loaded into the carried interpreter up front (DT_NEEDED), so that a
#: library torch needs later (librt, libdl, libpthread) comes from the same glibc, never from the image's.
GLIBC_PIECES = ("libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1")
#: What the copy leaves out: installed packages (pip is bootstrapped in the image), the test suite, Tk.
SKIP_DIRS = ("site-packages", "test", "__pycache__", "idlelib", "tkinter", "turtledemo", "_tkinter*")
PROBE = ("import json, platform, sys, sysconfig; print(json.dumps({'impl': platform.python_implementation(), "
         "'version': platform.python_version(), 'prefix': sys.base_prefix, 'exe': sys.executable, "
         "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED')), 'ldlibrary': sysconfig.get_config_var('LDLIBRARY')}))")


@dataclass(frozen=True)
class HostPython:
    """A CPython found on this host: its ``X.Y.Z`` version and install prefix."""

    version: str
    prefix: Path
    executable: Path
    shared: bool  # --enable-shared: the interpreter loads lib/libpythonX.Y.so

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def tag(self) -> str:
        return "cp" + self.minor.replace(".", "")


def _probe(exe: str, env: Mapping[str, str], run: Runner) -> HostPython | None:
    try:
        proc = run([exe, "-c", PROBE], capture_output=True, text=True, timeout=60, env=dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        data = json.loads((proc.stdout or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if data.get("impl") != "CPython":
        return None
    return HostPython(version=data["version"], prefix=Path(data["prefix"]), executable=Path(data["exe"]),
                      shared=bool(data.get("shared")))


def candidates(minor: str, environ: Mapping[str, str]) -> list[str]:
    """Where a CPython ``minor`` may be: $KFORGE_IMAGE_PYTHON, ``pythonX.Y`` on PATH, pyenv's, uv's."""
    found: list[str] = []
    if environ.get("KFORGE_IMAGE_PYTHON"):
        found.append(environ["KFORGE_IMAGE_PYTHON"])
    on_path = shutil.which(f"python{minor}", path=environ.get("PATH"))
    if on_path:
        found.append(on_path)
    home = Path(environ.get("HOME", "~")).expanduser()
    pyenv_root = Path(environ.get("PYENV_ROOT") or home / ".pyenv")
    found += [str(p) for p in sorted((pyenv_root / "versions").glob(f"{minor}.*/bin/python{minor}"), reverse=True)]
    uv_root = Path(environ.get("UV_PYTHON_INSTALL_DIR") or home / ".local" / "share" / "uv" / "python")
    found += [str(p) for p in sorted(uv_root.glob(f"cpython-{minor}.*-linux-*/bin/python{minor}"), reverse=True)]
    return list(dict.fromkeys(found))


def find_host_python(minor: str, environ: Mapping[str, str], *, run: Runner = subprocess.run) -> HostPython:
    """The first working CPython ``minor`` (e.g. ``3.12``) among :func:`candidates`."""
    tried = candidates(minor, environ)
    for exe in tried:
        found = _probe(exe, environ, run)
        if found is not None and found.minor == minor:
            return found
    raise ToolchainError(
        f"kforge's build image needs a CPython {minor} to carry in, and none works on this host",
        why=("tried " + ", ".join(tried)) if tried else f"no python{minor} on PATH, in pyenv or in uv's Pythons",
        fix=f"install one (`uv python install {minor}` or `pyenv install {minor}`), or point $KFORGE_IMAGE_PYTHON "
            f"at a python{minor}")


def elf_files(prefix: Path, minor: str) -> list[Path]:
    """The interpreter's ELF files: bin/pythonX.Y, lib/libpythonX.Y*.so*, lib-dynload/*.so."""
    files = [prefix / "bin" / f"python{minor}"]
    files += sorted(p for p in (prefix / "lib").glob(f"libpython{minor}*.so*") if p.is_file() and not p.is_symlink())
    files += sorted((prefix / "lib" / f"python{minor}" / "lib-dynload").glob("*.so"))
    return [f for f in files if f.is_file()]


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)|^\s*(/\S+)\s+\(0x[0-9a-f]+\)")


def parse_ldd(text: str) -> dict[str, Path]:
    """``ldd`` output -> {soname: resolved path}; the loader (``/lib64/ld-linux-x86-64.so.2``) by its own name."""
    out: dict[str, Path] = {}
    for line in text.splitlines():
        m = _LDD_LINE.match(line)
        if not m:
            continue
        if m.group(1):
            out[m.group(1)] = Path(m.group(2))
        else:
            out[Path(m.group(3)).name] = Path(m.group(3))
    return out


def runtime_libraries(files: Sequence[Path], prefix: Path, environ: Mapping[str, str], *,
                      run: Runner = subprocess.run) -> dict[str, Path]:
    """Every shared library ``files`` load (per ``ldd``), but the interpreter's own, plus :data:`GLIBC_PIECES`."""
    libs: dict[str, Path] = {}
    for f in files:
        proc = run(["ldd", str(f)], capture_output=True, text=True, env=dict(environ))
        if proc.returncode != 0:
            continue  # not dynamic (a static interpreter) or not for this machine
        libs.update(parse_ldd(proc.stdout or ""))
    libs = {name: path for name, path in libs.items()
            if not name.startswith("libpython") and not str(path).startswith(str(prefix) + os.sep)}
    libc = libs.get("libc.so.6")
    if libc is None:
        raise ToolchainError(f"ldd names no libc for the Python at {prefix}",
                             fix="carry in a dynamically linked CPython, or set $KFORGE_IMAGE_PYTHON to another one")
    for piece in GLIBC_PIECES:
        if piece not in libs and (libc.parent / piece).exists():
            libs[piece] = libc.parent / piece
    return dict(sorted(libs.items()))


def loader_name(libs: Mapping[str, Path]) -> str:
    names = [n for n in libs if n.startswith("ld-linux")]
    if not names:
        raise ToolchainError("ldd names no dynamic loader (ld-linux*) for the Python kforge carries into its image",
                             fix="carry in a dynamically linked CPython, or set $KFORGE_IMAGE_PYTHON to another one")
    return names[0]


def identity(py: HostPython) -> str:
    """What the image's key takes from the carried Python: its version and its binaries' bytes."""
    h = hashlib.sha256(py.version.encode())
    for f in elf_files(py.prefix, py.minor):
        h.update(f.name.encode() + sha256_file(f).encode())
    return h.hexdigest()[:12]


def stage_host_python(py: HostPython, cache_dir: Path, environ: Mapping[str, str], *,
                      run: Runner = subprocess.run) -> Path:
    """Copy ``py``'s prefix and runtime libraries to ``<cache>/images/python/<tag>-<identity>``; return it.

    The folder holds ``prefix/``, ``runtime/`` and ``python.json`` (version, host prefix, loader, libraries);
    an existing complete one is reused.
    """
    dest = Path(cache_dir) / "images" / "python" / f"{py.tag}-{identity(py)}"
    if (dest / "python.json").is_file():
        return dest
    libs = runtime_libraries(elf_files(py.prefix, py.minor), py.prefix, environ, run=run)
    loader = loader_name(libs)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(py.prefix, tmp / "prefix", symlinks=True, ignore=shutil.ignore_patterns(*SKIP_DIRS))
    (tmp / "runtime").mkdir()
    for name, path in libs.items():
        shutil.copy2(path, tmp / "runtime" / name)  # follows the links: the file under its soname
    atomic_write_text(tmp / "python.json", json.dumps({
        "version": py.version, "host_prefix": str(py.prefix), "loader": loader,
        "libraries": {n: str(p) for n, p in libs.items()}}, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def install_script(minor: str, host_prefix: str, loader: str, *, source: str = "/run/kforge-python") -> list[str]:
    """Shell lines that lay a staged Python (mounted at ``source``) at ``/opt/python/cpXY-cpXY``."""
    tag = "cp" + minor.replace(".", "")
    p = f"/opt/python/{tag}-{tag}"
    rt = f"{p}/lib/kforge-runtime"
    needed = " ".join(f"--add-needed {n}" for n in GLIBC_PIECES)
    return [
        f"mkdir -p {p} {rt}",
        f"cp -a {source}/prefix/. {p}/",
        f"cp -a {source}/runtime/. {rt}/",
        # the build configuration names the host's prefix: make it the image's, without the host's -rpath
        f"grep -rlI --null -F '{host_prefix}' {p}/lib/python{minor}/_sysconfigdata*.py {p}/lib/python{minor}/config-{minor}* "
        f"{p}/bin/python{minor}-config {p}/lib/pkgconfig 2>/dev/null | xargs -0 -r sed -i "
        f"-e 's#-Wl,-rpath,{host_prefix}/lib##g' -e 's#{host_prefix}#{p}#g'",
        # the interpreter runs on the carried glibc: its loader, its libraries first, glibc's pieces loaded up front
        # (one patchelf call per change: bullseye's patchelf 0.12 writes a wrong RPATH when they are combined)
        f"patchelf --set-interpreter {rt}/{loader} {p}/bin/python{minor}",
        f"patchelf {needed} {p}/bin/python{minor}",
        f"patchelf --force-rpath --set-rpath {rt}:{p}/lib {p}/bin/python{minor}",
        f"for f in {p}/lib/libpython{minor}*.so.* {p}/lib/python{minor}/lib-dynload/*.so; do "
        f'[ -f "$f" ] && [ ! -L "$f" ] && patchelf --force-rpath --set-rpath {rt}:{p}/lib "$f"; done',
        f"ln -sf python{minor} {p}/bin/python && ln -sf python{minor} {p}/bin/python3",
        f"{p}/bin/python -c 'import ssl, ctypes, zlib, lzma, bz2, sqlite3, hashlib; print(ssl.OPENSSL_VERSION)'",
        f"{p}/bin/python -m ensurepip --default-pip",
        f"ln -sf pip{minor} {p}/bin/pip",
    ]
