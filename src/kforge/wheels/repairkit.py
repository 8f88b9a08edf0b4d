"""What the repairers share (:mod:`kforge.wheels.auditwheel`, :mod:`kforge.wheels.delvewheel`) with
:mod:`kforge.wheels.repair`, which chooses one: the result and prepared-wheel types, a wheel's platform tag and
members, copying a wheel through unrepaired, and the relabelled wheel's fixed RECORD date."""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from wheel.wheelfile import WheelFile

from kforge.doctor.wheel import BINARY_NAME
from kforge.errors import RepairError

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


@dataclass(frozen=True)
class Prepared:
    wheel: Path
    members: list[str]
    plat: str | None
    notes: tuple[str, ...] = ()


def platform_tag(wheel_name: str) -> str:
    """The platform tag of a wheel file name, preferring the PEP 600 ``manylinux_x_y`` spelling."""
    try:
        _, _, _, tags = parse_wheel_filename(wheel_name)
    except InvalidWheelFilename as exc:
        raise RepairError(f"'{wheel_name}' is not a wheel file name", why=str(exc), fix="pass a .whl built by the build step") from exc
    plats = sorted({t.platform for t in tags})
    pep600 = [p for p in plats if p.startswith("manylinux_")]
    return (pep600 or plats)[0]


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


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


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
