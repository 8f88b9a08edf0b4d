"""Open wheels (or bare binaries) and inspect every ELF ``.so`` and PE ``.pyd``/``.dll`` in them."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from kforge.doctor.elf import ELF_MAGIC, NotABinaryError, read_elf
from kforge.doctor.fatbin import FatbinFormatError
from kforge.doctor.model import BinaryReport, WheelReport
from kforge.doctor.pe import PE_MAGIC, read_pe
from kforge.errors import DoctorError
from kforge.fsutil import sha256_file

BINARY_NAME = re.compile(r"\.(so(\.[0-9]+)*|pyd|dll)$", re.IGNORECASE)


def inspect_binary(path: Path | str, *, name: str | None = None) -> BinaryReport:
    """Inspect one ELF or PE file on disk. ``name`` is what the report calls it (default: the path)."""
    path = Path(path)
    if not path.is_file():
        raise DoctorError(f"no file at {path}", why="the path does not exist or is not a file", fix="pass a wheel, a directory of wheels, or a .so/.pyd/.dll")
    return inspect_bytes(path.read_bytes(), name or str(path))


def inspect_bytes(data: bytes, name: str) -> BinaryReport:
    """Inspect the bytes of one ELF or PE binary."""
    try:
        if data.startswith(ELF_MAGIC):
            return read_elf(data, name)
        if data.startswith(PE_MAGIC):
            return read_pe(data, name)
    except NotABinaryError as exc:
        raise DoctorError(f"cannot read {name}", why=str(exc), fix="rebuild it; the file is truncated or corrupt") from exc
    except FatbinFormatError as exc:
        raise DoctorError(
            f"cannot read the CUDA fatbin in {name}",
            why=str(exc),
            fix="rebuild it; if it was built by a newer nvcc than kforge knows, report the nvcc version to kforge",
        ) from exc
    raise DoctorError(f"{name} is neither an ELF nor a PE binary", why="its first bytes are not \\x7fELF or MZ", fix="pass a .so, .pyd or .dll")


def inspect_wheel(path: Path | str) -> WheelReport:
    """Inspect one wheel file (or the one wheel in a directory): every binary member, by its path inside the wheel."""
    path = Path(path)
    if path.is_dir():
        wheels = sorted(path.glob("*.whl"))
        if len(wheels) != 1:
            raise DoctorError(
                f"{path} holds {len(wheels)} wheels",
                why="inspect_wheel reports on one wheel (a directory is accepted when it holds exactly one)",
                fix="use inspect_wheels() for a directory of wheels, or pass the wheel's path",
            )
        path = wheels[0]
    if not path.is_file():
        raise DoctorError(f"no wheel at {path}", why="the file does not exist", fix="pass the path of a built .whl, or a directory of wheels")
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise DoctorError(f"{path.name} is not a wheel", why=f"its name is not a wheel file name ({exc})", fix="pass a .whl file") from exc
    digest = sha256_file(path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise DoctorError(f"{path.name} is not a wheel", why=f"it is not a zip archive ({exc})", fix="rebuild it; the file is truncated or corrupt") from exc
    binaries = []
    with zf:
        files = tuple(zf.namelist())
        for member in files:
            if member.endswith("/") or not BINARY_NAME.search(member):
                continue
            try:
                data = zf.read(member)
            except (zipfile.BadZipFile, OSError) as exc:
                raise DoctorError(f"cannot read {member} in {path.name}", why=str(exc), fix="rebuild the wheel; it is corrupt") from exc
            if data.startswith((ELF_MAGIC, PE_MAGIC)):
                binaries.append(inspect_bytes(data, member))
    return WheelReport(
        path=str(path),
        filename=path.name,
        name=str(name),
        version=str(version),
        tags=tuple(sorted(str(t) for t in tags)),
        size=path.stat().st_size,
        sha256=digest,
        binaries=tuple(binaries),
        files=files,
    )


def inspect_wheels(path_or_dir: Path | str) -> tuple[WheelReport, ...]:
    """One wheel file, or every ``*.whl`` in a directory (sorted by name)."""
    path = Path(path_or_dir)
    if path.is_dir():
        wheels = sorted(path.glob("*.whl"))
        if not wheels:
            raise DoctorError(f"no wheels in {path}", why="the directory holds no *.whl file", fix="pass a wheel or the directory the build wrote its wheels to")
        return tuple(inspect_wheel(w) for w in wheels)
    return (inspect_wheel(path),)
