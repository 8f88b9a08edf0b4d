"""Read each kernel's launch resources out of the cubins in a fatbin, and judge them against its arch's limits.

A binary can carry SASS for an arch and still be unable to run there: a kernel that asks for more
shared memory per block than the arch has (FlashMLA's sm90 kernels want ~200 KB; sm_120 has 99 KB),
more registers than a block of its declared size can get, or SASS that is only a stub (the body an
``#if __CUDA_ARCH__ == 900`` guard leaves for every other arch). This module proves launchability
from the binary itself, without a GPU:

* every SASS entry of every fatbin is inflated (zstd or LZ4 when nvcc compressed it) and read as
  the cubin ELF it is, with pyelftools;
* per kernel (a function with a ``.nv.info.<name>`` section): registers (``EIATTR_REGCOUNT`` in
  ``.nv.info``), per-thread stack (``EIATTR_FRAME_SIZE``), the block size its launch bounds declare
  (``EIATTR_MAX_THREADS`` / ``EIATTR_REQNTID``), static shared memory (the size of
  ``.nv.shared.<name>``, less the 1 KB the driver reserves per block on sm_90 and later, which nvcc
  13 adds to that section) and the size of its code;
* the dynamic shared memory a launcher asks for is host code (``cudaFuncSetAttribute``), not in the
  cubin. A launcher that wants it proven declares it in a launch manifest compiled into the same
  device code: ``extern "C" __device__ const KforgeLaunchSmem kforge_launch_smem[]`` of records
  ``{char kernel[96]; unsigned int bytes;}`` where ``kernel`` is a substring of the kernel's mangled
  name (the longest match wins). Kernels without a declaration are judged on static memory only, and
  the report says that their dynamic shared memory is unknown.

The limits come from :data:`kforge.cuda.limits.ARCH_LIMITS`. :func:`resource_findings` turns a binary's
kernels into findings: ``kernel-over-limit`` (error: shared memory, registers per thread, registers
for the declared block size, threads per block), ``stub-sass`` (error: every kernel with real code
elsewhere is a stub for this arch) and ``stub-kernels`` (info: some are; normal for multi-arch
builds whose kernels are arch-guarded).
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Iterable, Sequence

import lz4.block
import zstandard
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from kforge.cuda.limits import ARCH_LIMITS, ArchLimits
from kforge.doctor.fatbin import FatbinFormatError
from kforge.doctor.model import SASS, FatbinEntry, Finding, KernelResources

#: ``.nv.info`` attribute formats (first byte of each record) and the attributes read here.
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F

#: Name of the launch manifest symbol and the size of one record (char[96] + u32).
MANIFEST_SYMBOL = "kforge_launch_smem"
MANIFEST_NAME_BYTES = 96
MANIFEST_RECORD = struct.Struct(f"<{MANIFEST_NAME_BYTES}sI")

#: A kernel body this small, whose same-named kernel has real code (>= STUB_REAL_MIN) for another
#: arch of the binary, is a stub for this arch (an empty or trap-only body is a few instructions).
STUB_MAX_BYTES = 512
STUB_REAL_MIN = 4096


class CubinFormatError(FatbinFormatError):
    """A SASS entry that does not inflate to, or read as, a cubin ELF."""


def payload(data: bytes, entry: FatbinEntry) -> bytes:
    """The stored bytes of one fatbin entry (``data`` is the section the entry was parsed from), inflated."""
    if entry.offset + 8 > len(data):
        raise FatbinFormatError(f"fatbin entry at offset {entry.offset} is outside its section")
    header_size = struct.unpack_from("<I", data, entry.offset + 4)[0]
    start = entry.offset + header_size
    raw = data[start : start + entry.size]
    if entry.compression == "zstd":
        try:
            return zstandard.ZstdDecompressor().decompress(raw, max_output_size=entry.uncompressed_size)
        except zstandard.ZstdError as exc:
            raise CubinFormatError(f"the zstd-compressed {entry.arch} entry at offset {entry.offset} does not inflate ({exc})") from exc
    if entry.compression == "lz4":
        try:
            return lz4.block.decompress(raw, uncompressed_size=entry.uncompressed_size)
        except lz4.block.LZ4BlockError as exc:
            raise CubinFormatError(f"the LZ4-compressed {entry.arch} entry at offset {entry.offset} does not inflate ({exc})") from exc
    return raw


def section_kernels(data: bytes, entries: Iterable[FatbinEntry], *, strict: bool = True) -> tuple[KernelResources, ...]:
    """Every kernel of every linked SASS entry among ``entries`` (parsed from the section bytes ``data``).

    ``strict`` False (a data section scanned for embedded fatbins) skips an entry that is not a
    readable cubin instead of raising :class:`CubinFormatError`.
    """
    out: list[KernelResources] = []
    for entry in entries:
        if entry.kind != SASS or entry.relocatable:
            continue
        try:
            out.extend(cubin_kernels(payload(data, entry), entry.arch, entry.major))
        except FatbinFormatError:
            if strict:
                raise
    return tuple(out)


def cubin_kernels(cubin: bytes, arch: str, major: int) -> tuple[KernelResources, ...]:
    """The kernels of one cubin ELF for ``arch`` (``sm_120a``; ``major`` decides the reserved shared memory)."""
    try:
        elf = ELFFile(io.BytesIO(cubin))
        sections = {sec.name: sec for sec in elf.iter_sections()}
        symtab = elf.get_section_by_name(".symtab")
        symbols = list(symtab.iter_symbols()) if symtab is not None else []
    except (ELFError, ValueError, struct.error) as exc:
        raise CubinFormatError(f"the {arch} SASS entry is not a readable cubin ({exc})") from exc
    regs: dict[int, int] = {}
    frames: dict[int, int] = {}
    if ".nv.info" in sections:
        for attr, value in _nv_info(sections[".nv.info"].data()):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(value) >= 8:
                index, amount = struct.unpack_from("<II", value)
                (regs if attr == EIATTR_REGCOUNT else frames)[index] = amount
    manifest = _manifest(elf, symbols)
    options = ptxas_options(sections[".note.nv.tkinfo"].data()) if ".note.nv.tkinfo" in sections else None
    reserved = 1024 if major >= 9 else 0
    kernels = []
    for index, sym in enumerate(symbols):
        name = sym.name
        if sym["st_info"]["type"] != "STT_FUNC" or f".nv.info.{name}" not in sections:
            continue
        threads = None
        for attr, value in _nv_info(sections[f".nv.info.{name}"].data()):
            if attr in (EIATTR_MAX_THREADS, EIATTR_REQNTID) and len(value) >= 12:
                x, y, z = struct.unpack_from("<III", value)
                threads = x * y * z
        shared = sections.get(f".nv.shared.{name}")
        shared_size = int(shared["sh_size"]) if shared is not None else 0
        text = sections.get(f".text.{name}")
        kernels.append(
            KernelResources(
                name=name,
                arch=arch,
                registers=regs.get(index),
                static_smem=max(shared_size - reserved, 0) if shared is not None else 0,
                reserved_smem=min(shared_size, reserved),
                dynamic_smem=_declared(manifest, name),
                stack_bytes=frames.get(index, 0),
                max_threads=threads,
                code_bytes=int(text["sh_size"]) if text is not None else 0,
                ptxas=options,
            )
        )
    return tuple(kernels)


def ptxas_options(note: bytes) -> str | None:
    """The options ptxas ran with, from a cubin's ``.note.nv.tkinfo`` section (ELF notes of owner ``NVIDIA Corp``).

    Each note's descriptor holds a few 32-bit fields and then NUL-separated strings: the tool (``ptxas``), its version
    lines, and last its command line (``-arch sm_90 -m 64 -split-compile 4 ``). None when no note names ptxas."""
    found = None
    pos = 0
    while pos + 12 <= len(note):
        namesz, descsz, _ = struct.unpack_from("<III", note, pos)
        start = pos + 12 + ((namesz + 3) & ~3)
        desc = note[start:start + descsz]
        pos = start + ((descsz + 3) & ~3)
        texts = [w.decode("ascii") for w in desc.split(b"\0") if len(w) > 1 and all(32 <= c < 127 for c in w)]
        if "ptxas" in texts and texts[-1].startswith("-"):  # the command line comes last; no options, no answer
            found = texts[-1].strip()
    return found


def split_compile(options: str | None) -> int | None:
    """The ``-split-compile N`` of ptxas options (None: not split, or no options known)."""
    m = re.search(r"(?:^|\s)-{1,2}split-compile[ =](\d+)", options or "")
    return int(m.group(1)) if m else None


def _nv_info(data: bytes) -> list[tuple[int, bytes]]:
    """``(attribute, value bytes)`` of every record of a ``.nv.info`` section."""
    out = []
    pos = 0
    while pos + 2 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == EIFMT_SVAL:
            if pos + 4 > len(data):
                break
            size = struct.unpack_from("<H", data, pos + 2)[0]
            out.append((attr, data[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        elif fmt in (EIFMT_HVAL, EIFMT_BVAL):
            out.append((attr, data[pos + 2 : pos + 4]))
            pos += 4
        elif fmt == EIFMT_NVAL:
            out.append((attr, b""))
            pos += 4
        else:
            break  # an unknown format: stop rather than misread the rest
    return out


def _manifest(elf: ELFFile, symbols: Sequence) -> list[tuple[str, int]]:  # type: ignore[type-arg]
    out = []
    for sym in symbols:
        if sym.name != MANIFEST_SYMBOL or sym["st_info"]["type"] != "STT_OBJECT":
            continue
        sec = elf.get_section(sym["st_shndx"]) if isinstance(sym["st_shndx"], int) else None
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            continue
        blob = sec.data()[sym["st_value"] : sym["st_value"] + sym["st_size"]]
        for off in range(0, len(blob) - MANIFEST_RECORD.size + 1, MANIFEST_RECORD.size):
            raw_name, amount = MANIFEST_RECORD.unpack_from(blob, off)
            text = raw_name.split(b"\0", 1)[0].decode("ascii", "replace")
            if text:
                out.append((text, amount))
    return out


def _declared(manifest: Sequence[tuple[str, int]], kernel: str) -> int | None:
    matches = [(len(text), amount) for text, amount in manifest if text in kernel]
    return max(matches)[1] if matches else None


def resource_findings(label: str, binary: str, kernels: Sequence[KernelResources]) -> list[Finding]:
    """Findings for one binary's kernels: over an arch's limits, or stub-only SASS for an arch."""
    findings: list[Finding] = []
    for k in kernels:
        number = _number(k.arch)
        lim = ARCH_LIMITS.get(number)
        if lim is None:
            continue
        problems = over_limits(k, lim)
        for what in problems:
            findings.append(
                Finding(
                    "error",
                    "kernel-over-limit",
                    f"{label}: {binary}: kernel {k.name} for {k.arch} {what}; it cannot launch on an {lim.name} GPU "
                    "('too many resources requested for launch' or 'invalid argument')",
                    binary=binary,
                    arch=k.arch,
                )
            )
    findings.extend(_stub_findings(label, binary, kernels))
    return findings


def over_limits(k: KernelResources, lim: ArchLimits) -> list[str]:
    """What about ``k`` exceeds ``lim``, each as a phrase naming the amount and the limit."""
    out = []
    if k.smem_per_block > lim.max_smem_per_block:
        dyn = f"{k.dynamic_smem:,} B dynamic (declared by its launcher) + " if k.dynamic_smem else ""
        out.append(
            f"needs {dyn}{k.static_smem:,} B static = {k.smem_per_block:,} B of shared memory per block, "
            f"over the {lim.max_smem_per_block:,} B ({lim.max_smem_per_block / 1024:g} KB) limit of {lim.name}"
        )
    if k.static_smem > lim.max_static_smem:
        out.append(f"has {k.static_smem:,} B of static shared memory, over the {lim.max_static_smem:,} B static limit")
    if k.registers is not None and k.registers > lim.max_regs_per_thread:
        out.append(f"uses {k.registers} registers per thread, over the {lim.max_regs_per_thread} limit")
    if k.max_threads is not None:
        if k.max_threads > lim.max_threads_per_block:
            out.append(f"declares {k.max_threads} threads per block, over the {lim.max_threads_per_block} limit")
        elif k.registers is not None:
            per_thread = -(-k.registers // lim.reg_alloc_unit) * lim.reg_alloc_unit
            warps = -(-k.max_threads // 32)
            need = per_thread * 32 * warps
            if need > lim.regs_per_block:
                out.append(
                    f"needs {need:,} registers for its declared {k.max_threads} threads ({k.registers} per thread), "
                    f"over the {lim.regs_per_block:,} a block can have"
                )
    return out


def _stub_findings(label: str, binary: str, kernels: Sequence[KernelResources]) -> list[Finding]:
    biggest: dict[str, int] = {}
    for k in kernels:
        biggest[k.name] = max(biggest.get(k.name, 0), k.code_bytes)
    by_arch: dict[str, list[KernelResources]] = {}
    for k in kernels:
        by_arch.setdefault(k.arch, []).append(k)
    out = []
    for arch, ks in sorted(by_arch.items()):
        stubs = [k for k in ks if k.code_bytes <= STUB_MAX_BYTES and biggest[k.name] >= STUB_REAL_MIN]
        if not stubs:
            continue
        example = stubs[0]
        detail = f"e.g. {example.name}: {example.code_bytes} B here, {biggest[example.name]:,} B on another arch"
        if all(k.code_bytes <= STUB_MAX_BYTES for k in ks):
            out.append(
                Finding(
                    "error",
                    "stub-sass",
                    f"{label}: {binary} has SASS for {arch}, but every kernel there is a stub ({len(stubs)} with real code "
                    f"on another arch; {detail}): the build compiled its kernels out for {arch}",
                    binary=binary,
                    arch=arch,
                )
            )
        else:
            out.append(
                Finding(
                    "info",
                    "stub-kernels",
                    f"{label}: {binary}: {len(stubs)} kernel(s) are stubs for {arch} ({detail}); calls that reach them on {arch} fail",
                    binary=binary,
                    arch=arch,
                )
            )
    return out


def _number(arch: str) -> int:
    digits = "".join(ch for ch in arch.split("_", 1)[-1] if ch.isdigit())
    return int(digits) if digits else 0
