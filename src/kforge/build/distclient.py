"""sccache-dist's client settings for a kforge build: the host-compiler shims travel as the real compilers.

With reproducible device paths (:mod:`kforge.build.reproducible`), kforge's nvcc wrapper gives nvcc a host
compiler that is a small script (``<work>/nvcc-wrap/hostcc/c++``, :mod:`kforge.cuda.devicepaths`): it runs the real
compiler and maps the line markers of what it *preprocesses*. Under sccache-dist the preprocessing runs on the
client, where the shim works as always; the host *compile* of a unit is sent to a build server, and sccache must
pack the compiler it names into a toolchain. It cannot pack a script ("Could not package toolchain: Failed to
analyse .../hostcc/gcc with ldd: Elf magic not found"), and then the whole unit compiles on the client: a
"distributed" build that distributes nothing.

For a compile (not ``-E``) the shim only runs the real compiler with the same arguments, so the server may run the
real one. :func:`prepare` packs each real host compiler once (``sccache --package-toolchain``) and writes a client
config: the user's ``SCCACHE_CONF`` with one ``path_override`` toolchain per shim (the shim's path locally, the
real compiler inside the archive remotely). The build's ``SCCACHE_CONF`` points at it. Without a ``[dist]``
scheduler in the user's config, or without shims, nothing changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from kforge.errors import ToolchainError
from kforge.fsutil import atomic_write_text

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def toml_dumps(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """TOML for what :mod:`tomllib` reads from an sccache config (tables, arrays of tables, strings, numbers)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    arrays: list[tuple[str, list[Mapping[str, Any]]]] = []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            lines.append(f"{_key(k)} = {_value(v)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = ".".join(_key(p) for p in (*prefix, k))
        out += f"\n[{name}]\n" + toml_dumps(v, (*prefix, k))
    for k, items in arrays:
        name = ".".join(_key(p) for p in (*prefix, k))
        for item in items:
            out += f"\n[[{name}]]\n" + toml_dumps(item, (*prefix, k))
    return out


def scheduler(conf: Mapping[str, Any]) -> str | None:
    dist = conf.get("dist")
    return str(dist["scheduler_url"]) if isinstance(dist, dict) and dist.get("scheduler_url") else None


def prepare(env: Mapping[str, str], shim_dir: Path, out_dir: Path, sccache: Path | str, *,
            exclude: tuple[Path, ...] = (),
            runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> dict[str, str]:
    """``{"SCCACHE_CONF": <derived config>}`` for a build whose nvcc steps use the shims in ``shim_dir``, or {}.

    The shims are named after the real compilers (``c++``, ``gcc``...): one is written per name nvcc is given, so
    every name a build may use gets an override, each with the real compiler of that name on ``PATH`` (``NVCC_CCBIN``
    for its own name).
    """
    path = env.get("SCCACHE_CONF")
    if not path:
        return {}
    try:
        conf = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ToolchainError(f"SCCACHE_CONF={path} cannot be read as TOML: {exc}",
                             fix="point SCCACHE_CONF at sccache's client config (docs/distributed.md)") from exc
    if scheduler(conf) is None:
        return {}
    reals: dict[str, str] = {}
    ccbin = env.get("NVCC_CCBIN")
    if ccbin and os.path.isfile(ccbin):
        reals[os.path.basename(ccbin)] = ccbin
    search = _without(env.get("PATH", ""), (Path(shim_dir), *exclude))  # the real compilers, not kforge's wrappers
    for name in ("gcc", "g++", "c++", "cc"):  # nvcc's default host compiler is gcc
        if name not in reals:
            found = shutil.which(name, path=search)
            if found:
                reals[name] = found
    out_dir.mkdir(parents=True, exist_ok=True)
    archives: dict[str, Path] = {}
    overrides = []
    for name, real in sorted(reals.items()):
        key = os.path.realpath(real)
        if key not in archives:
            archive = out_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", key.strip("/")) + ".tar.gz")
            if not archive.is_file():
                proc = runner([str(sccache), "--package-toolchain", real, str(archive)], capture_output=True,
                              text=True, env=dict(env))
                if proc.returncode != 0 or not archive.is_file():
                    raise ToolchainError(f"sccache could not pack the host compiler {real} for sccache-dist: "
                                         f"{(proc.stderr or proc.stdout).strip()[-400:]}",
                                         fix="check that sccache >= 0.10 is on PATH, or build without "
                                             "SCCACHE_CONF's [dist] (KFORGE_COMPILER_CACHE=ccache or none)")
            archives[key] = archive
        overrides.append({"type": "path_override", "compiler_executable": str(Path(shim_dir) / name),
                          "archive": str(archives[key]), "archive_compiler_executable": real})
    dist = dict(conf["dist"])
    dist["toolchains"] = [*[t for t in dist.get("toolchains", []) if isinstance(t, dict)], *overrides]
    derived = out_dir / "sccache-client.conf"
    atomic_write_text(derived, toml_dumps({**conf, "dist": dist}))
    return {"SCCACHE_CONF": str(derived)}


def _without(path: str, folders: tuple[Path, ...]) -> str:
    drop = {os.path.realpath(f) for f in folders}
    return os.pathsep.join(p for p in path.split(os.pathsep) if p and os.path.realpath(p) not in drop)


def start_client(env: Mapping[str, str], sccache: Path | str,
                 runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> str | None:
    """Start the sccache client daemon with the build's ``SCCACHE_CONF`` now, from kforge's own process; None when it
    started, else why not (a daemon that already runs keeps the config it was started with).

    Left to start itself, the daemon is spawned by the build's first compile, deep under pip, CMake or ninja; under
    CMake's compiler checks its compiles were seen to die of SIGHUP ("Compiler killed by signal 1").
    """
    proc = runner([str(sccache), "--start-server"], capture_output=True, text=True, env=dict(env))
    if proc.returncode == 0:
        return None
    said = (proc.stderr or proc.stdout).strip().splitlines()
    return said[-1] if said else f"sccache --start-server exited {proc.returncode}"
