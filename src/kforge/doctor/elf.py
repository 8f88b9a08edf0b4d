"""Read an ELF shared object (or object file) with pyelftools into a :class:`BinaryReport`."""

from __future__ import annotations

import io
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from kforge.doctor.fatbin import count_containers, parse_fatbins
from kforge.doctor.model import BinaryReport, FatbinEntry, KernelResources, SectionSize
from kforge.doctor.resources import section_kernels

#: Sections that hold fatbins by name: linked device code, and the relocatable device
#: code of ``-rdc=true`` objects (which still needs a device link).
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
#: Data sections scanned for fatbins embedded as plain data (e.g. for cuModuleLoadData).
SCANNED_SECTIONS = (".rodata", ".data", ".data.rel.ro", ".lrodata", ".ldata")

ELF_MAGIC = b"\x7fELF"


class NotABinaryError(ValueError):
    pass


def section_sizes(data: bytes) -> dict[str, int]:
    """Name -> size of every named section of an ELF file, without reading any of them (no fatbin parsing)."""
    try:
        return {sec.name: int(sec["sh_size"]) for sec in ELFFile(io.BytesIO(data)).iter_sections() if sec.name}
    except (ELFError, ValueError, struct.error) as exc:
        raise NotABinaryError(f"it is not a readable ELF file ({exc})") from exc


def read_elf(data: bytes, path: str) -> BinaryReport:
    try:
        elf = ELFFile(io.BytesIO(data))
        sections = list(elf.iter_sections())
    except (ELFError, ValueError, struct.error) as exc:
        raise NotABinaryError(f"it is not a readable ELF file ({exc})") from exc

    fatbins: list[FatbinEntry] = []
    kernels: list[KernelResources] = []
    sizes = []
    dynsym_undefined: list[str] | None = None
    symtab_undefined: list[str] = []
    needed: list[str] = []
    rpath: list[str] = []
    soname = None
    for sec in sections:
        name = sec.name
        if name:
            sizes.append(SectionSize(name, int(sec["sh_size"])))
        if sec["sh_type"] == "SHT_NOBITS":
            continue
        if name in FATBIN_SECTIONS or name in SCANNED_SECTIONS:
            found = parse_fatbins(sec.data(), section=name, strict=name in FATBIN_SECTIONS, first_container=count_containers(tuple(fatbins)))
            fatbins.extend(found)
            kernels.extend(section_kernels(sec.data(), found, strict=name in FATBIN_SECTIONS))
        if isinstance(sec, DynamicSection):
            for tag in sec.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)  # type: ignore[attr-defined]
                elif tag.entry.d_tag == "DT_RPATH":
                    rpath.extend(p for p in tag.rpath.split(":") if p)  # type: ignore[attr-defined]
                elif tag.entry.d_tag == "DT_RUNPATH":
                    rpath.extend(p for p in tag.runpath.split(":") if p)  # type: ignore[attr-defined]
                elif tag.entry.d_tag == "DT_SONAME":
                    soname = tag.soname  # type: ignore[attr-defined]
        if isinstance(sec, SymbolTableSection):
            names = [
                s.name
                for s in sec.iter_symbols()
                if s.name and s["st_shndx"] == "SHN_UNDEF" and s["st_info"]["type"] != "STT_FILE"
            ]
            if sec.name == ".dynsym":
                dynsym_undefined = names
            else:
                symtab_undefined.extend(names)
    # A shared object is resolved through .dynsym; an object file only has .symtab.
    undefined = dynsym_undefined if dynsym_undefined is not None else symtab_undefined
    return BinaryReport(
        path=path,
        format="elf",
        size=len(data),
        fatbins=tuple(fatbins),
        containers=count_containers(tuple(fatbins)),
        undefined_symbols=tuple(sorted(set(undefined))),
        needed=tuple(needed),
        rpath=tuple(rpath),
        soname=soname,
        sections=tuple(sizes),
        kernels=tuple(kernels),
    )

