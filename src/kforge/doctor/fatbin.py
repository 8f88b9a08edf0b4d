"""Parse CUDA fatbin containers (the ``.nv_fatbin`` payload of a CUDA binary).

The layout below was read off real nvcc 13.0 output (``nvcc -fatbin -gencode ...`` for
sm_80, sm_90a, sm_100f, sm_103a, sm_110f, sm_120a and compute_86/90/120a PTX, with and
without ``-Xfatbin -compress-all`` and each ``--compress-mode``) and checked against
``cuobjdump --list-elf --list-ptx``. All fields are little-endian.

Container header, 16 bytes::

    u32 magic = 0xBA55ED50   u16 version = 1   u16 header_size = 16   u64 payload_size

followed by ``payload_size`` bytes of entries. Several containers (one per translation
unit) follow each other in a section, 8-byte aligned. Entry header (``header_size`` is 64,
or more for PTX, LTO IR and Blackwell-era cubins, which append an extension)::

    0  u16 kind             1 = PTX, 2 = ELF (SASS cubin), 8 = LTO IR (-dlto / code=lto_XY)
    2  u16 (0x0101)
    4  u32 header_size
    8  u64 payload_size     bytes stored after the header (padded)
    16 u32 compressed_size  0 when stored uncompressed
    24 u16 minor, u16 major  PTX ISA version for PTX, format version for ELF
    28 u32 arch             compute capability as a number: 90, 100, 120, ...
    40 u64 flags            0x0001 64-bit, 0x0010 Linux host, 0x2000 LZ4, 0x8000 Zstandard,
                            0x100000 arch-specific ("a"), 0x200000 family ("f")
    56 u64 uncompressed_size (0 when stored uncompressed)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from kforge.doctor.model import LTO, PTX, SASS, FatbinEntry

MAGIC = 0xBA55ED50
MAGIC_BYTES = struct.pack("<I", MAGIC)

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")  # 64 bytes

KINDS = {1: PTX, 2: SASS, 8: LTO}
PREFIX = {SASS: "sm", PTX: "compute", LTO: "lto"}

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000


class FatbinFormatError(ValueError):
    """Bytes that start like a fatbin but do not hold together."""


def parse_fatbins(data: bytes, *, section: str = ".nv_fatbin", strict: bool = True, first_container: int = 0) -> tuple[FatbinEntry, ...]:
    """Every entry of every container found in ``data`` (a section's bytes).

    ``strict``: a section whose name says it holds fatbins must parse completely; a
    malformed container raises :class:`FatbinFormatError`. With ``strict=False`` (used to
    scan other data sections for embedded fatbins) a candidate that does not hold
    together is skipped.
    """
    return tuple(_iter_entries(data, section=section, strict=strict, first_container=first_container))


def count_containers(entries: tuple[FatbinEntry, ...]) -> int:
    return len({(e.section, e.container) for e in entries})


def _iter_entries(data: bytes, *, section: str, strict: bool, first_container: int) -> Iterator[FatbinEntry]:
    pos = 0
    container = first_container
    relocatable = section == "__nv_relfatbin"
    while True:
        pos = data.find(MAGIC_BYTES, pos)
        if pos < 0:
            return
        try:
            entries, end = _parse_container(data, pos, section=section, container=container, relocatable=relocatable)
        except FatbinFormatError:
            if strict:
                raise
            pos += 1
            continue
        yield from entries
        container += 1
        pos = end


def _parse_container(data: bytes, pos: int, *, section: str, container: int, relocatable: bool) -> tuple[list[FatbinEntry], int]:
    if pos + _CONTAINER.size > len(data):
        raise FatbinFormatError(f"truncated fatbin header at offset {pos}")
    magic, version, header_size, payload_size = _CONTAINER.unpack_from(data, pos)
    if magic != MAGIC or version != 1 or header_size < _CONTAINER.size:
        raise FatbinFormatError(f"unknown fatbin header at offset {pos} (version {version}, header size {header_size})")
    start = pos + header_size
    end = start + payload_size
    if end > len(data):
        raise FatbinFormatError(f"fatbin at offset {pos} claims {payload_size} bytes, only {len(data) - start} are there")
    entries = []
    p = start
    while p < end:
        if p + _ENTRY.size > end:
            raise FatbinFormatError(f"truncated fatbin entry at offset {p}")
        (kind_id, _v, ehs, size, csize, _u20, minor, major, arch, _noff, _nlen, flags, _zero, usize) = _ENTRY.unpack_from(data, p)
        if ehs < _ENTRY.size or p + ehs + size > end:
            raise FatbinFormatError(f"fatbin entry at offset {p} does not fit its container")
        kind = KINDS.get(kind_id)
        if kind is None:
            raise FatbinFormatError(f"fatbin entry at offset {p} has unknown kind {kind_id}")
        if not 10 <= arch <= 999:
            raise FatbinFormatError(f"fatbin entry at offset {p} has an implausible arch {arch}")
        variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
        compression = "zstd" if flags & FLAG_ZSTD else "lz4" if flags & FLAG_LZ4 else None
        entries.append(
            FatbinEntry(
                kind=kind,
                arch=f"{PREFIX[kind]}_{arch}{variant}",
                major=arch // 10,
                minor=arch % 10,
                variant=variant,
                compressed=compression is not None,
                compression=compression,
                size=csize if compression and csize else size,
                uncompressed_size=usize if compression and usize else size,
                version=f"{major}.{minor}",
                section=section,
                container=container,
                offset=p,
                relocatable=relocatable,
            )
        )
        p += ehs + size
    return entries, end
