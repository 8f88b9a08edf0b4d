"""The auditwheel repairer (Linux): ``--plat`` from the project's platform-tag policy, ``--exclude`` per policy
pattern, and the wheel prepared for it first (shared libraries out of purelib, a claimed platform tag dropped)."""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from kforge.config.repairpolicy import RepairPolicy
from kforge.errors import RepairError
from kforge.fsutil import prepend_path
from kforge.wheels import platformtag
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

NO_ELF_MARKERS = ("no ELF executable or shared library", "does not look like a platform wheel")


class Auditwheel:
    name = "auditwheel"

    def prepare(self, wheel: Path, work: Path, members: list[str], *, plat: str | None,
                platform_policy: str | None) -> Prepared:
        if platform_policy and not plat:
            plat = platformtag.wheel_tag(platform_policy, _machine(wheel.name))
        prepared, notes = prepare_for_auditwheel(wheel, work, members)
        # grafted = what auditwheel added, not what the move renamed
        return Prepared(prepared, _wheel_members(prepared) if notes else members, plat, tuple(notes))

    def command(self, wheel: Path, out: Path, *, python: str, plat: str | None, policy: RepairPolicy,
                paths: Sequence[str], env: dict[str, str]) -> list[str]:
        cmd = [python, "-m", "auditwheel", "repair", "-w", str(out)]
        if plat:
            cmd += ["--plat", plat]
        for pattern in policy.linux_exclude:
            cmd += ["--exclude", pattern]
        if paths:
            env["AUDITWHEEL_LD_LIBRARY_PATH"] = prepend_path(os.pathsep.join(paths), env.get("AUDITWHEEL_LD_LIBRARY_PATH"))
        return [*cmd, str(wheel)]

    def failed(self, wheel: Path, out_dir: Path, *, code: int, log: str, plat: str | None,
               cmd: Sequence[str]) -> RepairResult | None:
        if any(m in log for m in NO_ELF_MARKERS):
            return _copy_through(wheel, out_dir, log.strip())
        if plat and "too-recent versioned symbols" in log:
            raise _too_new_error(wheel, plat, cmd, log)
        return None


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
