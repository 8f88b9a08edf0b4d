"""The fatbin parser on containers assembled here byte by byte (the real-nvcc checks are in
tests/integration/test_doctor_real.py)."""

from __future__ import annotations

import struct

import pytest

from kforge.doctor.fatbin import (
    FLAG_ARCH_SPECIFIC,
    FLAG_FAMILY,
    FLAG_LZ4,
    FLAG_ZSTD,
    MAGIC,
    FatbinFormatError,
    parse_fatbins,
)


def entry(kind: int, arch: int, flags: int = 0x11, payload: bytes = b"\0" * 24, *, usize: int = 0, header: int = 64, version: tuple[int, int] = (1, 8)) -> bytes:
    compressed = bool(flags & (FLAG_LZ4 | FLAG_ZSTD))
    head = struct.pack(
        "<HHIQIIHHIIIQQQ",
        kind, 0x0101, header, len(payload), len(payload) if compressed else 0, 0,
        version[1], version[0], arch, 0, 0, flags, 0, usize if compressed else 0,
    )  # fmt: skip
    return head + b"\0" * (header - 64) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def test_kinds_arches_and_variants() -> None:
    data = container(
        entry(2, 80),
        entry(2, 90, 0x11 | FLAG_ARCH_SPECIFIC),
        entry(2, 100, 0x11 | FLAG_FAMILY, header=112),
        entry(1, 120, 0x11 | FLAG_ARCH_SPECIFIC, header=80, version=(9, 0)),
        entry(8, 90, 0x11, header=120),
    )
    got = [(e.kind, e.arch, e.major, e.minor, e.variant) for e in parse_fatbins(data)]
    assert got == [
        ("sass", "sm_80", 8, 0, ""),
        ("sass", "sm_90a", 9, 0, "a"),
        ("sass", "sm_100f", 10, 0, "f"),
        ("ptx", "compute_120a", 12, 0, "a"),
        ("lto", "lto_90", 9, 0, ""),
    ]
    assert parse_fatbins(data)[3].version == "9.0"


@pytest.mark.parametrize(("flag", "name"), [(FLAG_ZSTD, "zstd"), (FLAG_LZ4, "lz4"), (0, None)])
def test_compression_flags(flag: int, name: str | None) -> None:
    (e,) = parse_fatbins(container(entry(2, 90, 0x11 | flag, payload=b"z" * 40, usize=400)))
    assert e.compression == name and e.compressed is (name is not None)
    assert e.size == 40
    assert e.uncompressed_size == (400 if name else 40)


def test_several_containers_with_padding_are_numbered() -> None:
    first = container(entry(2, 80))
    data = first + b"\0" * (8 - len(first) % 8 if len(first) % 8 else 0) + container(entry(2, 120), entry(1, 120, header=80))
    entries = parse_fatbins(data, first_container=3)
    assert [(e.arch, e.container) for e in entries] == [("sm_80", 3), ("sm_120", 4), ("compute_120", 4)]


@pytest.mark.parametrize(
    "data",
    [
        container(entry(2, 80))[:-5],  # payload cut short
        struct.pack("<IHHQ", MAGIC, 2, 16, 0),  # unknown container version
        container(entry(5, 80)),  # unknown entry kind
        container(entry(2, 80, header=32)),  # header smaller than the fixed part
        container(entry(2, 4000)),  # implausible arch
    ],
)
def test_malformed_fatbin_in_a_fatbin_section_raises(data: bytes) -> None:
    with pytest.raises(FatbinFormatError):
        parse_fatbins(data, strict=True)


def test_scanning_other_data_skips_lookalikes() -> None:
    junk = struct.pack("<I", MAGIC) + b"\xff" * 30  # starts like a fatbin, is not one
    data = b"text" + junk + b"\0" * 2 + container(entry(2, 86))
    assert [e.arch for e in parse_fatbins(data, section=".rodata", strict=False)] == ["sm_86"]
    with pytest.raises(FatbinFormatError):
        parse_fatbins(data, strict=True)


def test_relocatable_section_marks_entries() -> None:
    (e,) = parse_fatbins(container(entry(2, 80)), section="__nv_relfatbin")
    assert e.relocatable and e.section == "__nv_relfatbin"


def test_no_magic_means_no_entries() -> None:
    assert parse_fatbins(b"\0" * 64) == ()
