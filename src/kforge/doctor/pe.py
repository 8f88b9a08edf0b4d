"""Read a PE image (``.pyd``/``.dll``) with pefile into a :class:`BinaryReport`.

MSVC-hosted nvcc puts the fatbins in a section named ``.nv_fatb`` (PE section names
have at most 8 bytes); ``.nv_fatbin`` is accepted too. Read-only data sections are
scanned for fatbins embedded as data. A linked PE image has no undefined symbols;
``needed`` lists its imported DLLs (normal and delay-loaded).
"""

from __future__ import annotations

import pefile  # type: ignore[import-untyped]

from kforge.doctor.elf import NotABinaryError
from kforge.doctor.fatbin import count_containers, parse_fatbins
from kforge.doctor.model import BinaryReport, FatbinEntry, KernelResources, SectionSize
from kforge.doctor.resources import section_kernels

FATBIN_SECTIONS = (".nv_fatb", ".nv_fatbin", ".nv_fatbi")
SCANNED_SECTIONS = (".rdata", ".data")

PE_MAGIC = b"MZ"


def read_pe(data: bytes, path: str) -> BinaryReport:
    try:
        pe = pefile.PE(data=data, fast_load=True)
        pe.parse_data_directories(
            directories=[
                pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_IMPORT"],
                pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_DELAY_IMPORT"],
            ]
        )
    except pefile.PEFormatError as exc:
        raise NotABinaryError(f"it is not a readable PE file ({exc})") from exc
    try:
        fatbins: list[FatbinEntry] = []
        kernels: list[KernelResources] = []
        sizes = []
        for sec in pe.sections:
            name = _section_name(pe, data, sec.Name)
            sizes.append(SectionSize(name, int(sec.SizeOfRawData)))
            if name in FATBIN_SECTIONS or name in SCANNED_SECTIONS:
                raw = sec.get_data()
                found = parse_fatbins(
                    raw,
                    section=name,
                    strict=name in FATBIN_SECTIONS,
                    first_container=count_containers(tuple(fatbins)),
                )
                fatbins.extend(found)
                kernels.extend(section_kernels(raw, found, strict=name in FATBIN_SECTIONS))
        needed: list[str] = []
        for attr in ("DIRECTORY_ENTRY_IMPORT", "DIRECTORY_ENTRY_DELAY_IMPORT"):
            for entry in getattr(pe, attr, ()):
                dll = entry.dll.decode("ascii", "replace")
                if dll not in needed:
                    needed.append(dll)
    finally:
        pe.close()
    return BinaryReport(
        path=path,
        format="pe",
        size=len(data),
        fatbins=tuple(fatbins),
        containers=count_containers(tuple(fatbins)),
        needed=tuple(needed),
        sections=tuple(sizes),
        kernels=tuple(kernels),
    )


def _section_name(pe: pefile.PE, data: bytes, raw: bytes) -> str:
    """A section's name; GNU tools write names longer than 8 bytes as ``/<offset>`` into the
    COFF string table (which follows the symbol table)."""
    name = raw.rstrip(b"\0").decode("ascii", "replace")
    if not (name.startswith("/") and name[1:].isdigit()):
        return name
    header = pe.FILE_HEADER
    table = header.PointerToSymbolTable + header.NumberOfSymbols * 18
    start = table + int(name[1:])
    if not header.PointerToSymbolTable or start >= len(data):
        return name
    end = data.find(b"\0", start)
    return data[start : end if end >= 0 else len(data)].decode("ascii", "replace") or name
