"""Result types of the wheel doctor (its arch type is :class:`kforge.cuda.arch.Arch`).

Everything here is a frozen dataclass, so a report can be compared, hashed, stored in a
manifest (:func:`kforge.doctor.render.to_json`) and handed from step to step unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kforge.cuda.arch import LTO, PTX, SASS, Arch

# Kinds of payload in a fatbin (device code in a cubin ELF, PTX text, LTO IR) and the arch type:
# kforge.cuda.arch's, the one model of an arch. An entry's arch may be outside kforge's table (an old
# wheel's sm_70), so it is built with Arch.observed.
__all__ = ["LTO", "PTX", "SASS", "Arch", "BinaryReport", "FatbinEntry", "Finding", "SectionSize", "WheelReport",
           "is_debug_section"]

#: Host debug info (DWARF, and ``.zdebug_*``, its old compressed form): what ``strip --strip-debug`` removes.
DEBUG_PREFIXES = (".debug_", ".zdebug_")


def is_debug_section(name: str) -> bool:
    return name.startswith(DEBUG_PREFIXES)


@dataclass(frozen=True)
class FatbinEntry:
    """One payload of a fatbin container, as its header describes it.

    ``arch`` is ``sm_90a`` for SASS, ``compute_120a`` for PTX, ``lto_90`` for LTO IR.
    ``size`` is the number of bytes stored in the binary (compressed when ``compressed``);
    ``uncompressed_size`` is the payload's size once inflated.
    """

    kind: str
    arch: str
    major: int
    minor: int
    variant: str
    compressed: bool
    compression: str | None
    size: int
    uncompressed_size: int
    version: str
    section: str
    container: int
    offset: int
    relocatable: bool = False

    @property
    def cuda_arch(self) -> Arch:
        return Arch.observed(self.major, self.minor, self.variant)


@dataclass(frozen=True)
class SectionSize:
    name: str
    size: int


@dataclass(frozen=True)
class KernelResources:
    """One kernel of one cubin: what a launch of it needs (read by :mod:`kforge.doctor.resources`).

    ``static_smem`` excludes the shared memory the driver reserves per block (``reserved_smem``);
    ``dynamic_smem`` is what the launcher declares in a kforge launch manifest, None when undeclared;
    ``max_threads`` is the block size its launch bounds declare, None without them;
    ``ptxas`` the options ptxas ran with (``-arch sm_90 -m 64 -split-compile 4``), as its cubin records them.
    """

    name: str
    arch: str
    registers: int | None
    static_smem: int
    reserved_smem: int
    dynamic_smem: int | None
    stack_bytes: int
    max_threads: int | None
    code_bytes: int
    ptxas: str | None = None  # the ptxas options its cubin's .note.nv.tkinfo records; None: no such note

    @property
    def smem_per_block(self) -> int:
        """Static plus declared dynamic shared memory: what the driver checks against the opt-in limit."""
        return self.static_smem + (self.dynamic_smem or 0)


@dataclass(frozen=True)
class BinaryReport:
    """What one ELF shared object or PE DLL/pyd carries.

    ``path`` is the path inside the wheel (or the file path for a bare binary).
    ``undefined_symbols`` are the dynamic symbols the binary needs from elsewhere (ELF only:
    a linked PE image cannot have unresolved symbols, its imports are in ``needed``).
    """

    path: str
    format: str
    size: int
    fatbins: tuple[FatbinEntry, ...] = ()
    containers: int = 0
    undefined_symbols: tuple[str, ...] = ()
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    soname: str | None = None
    sections: tuple[SectionSize, ...] = ()
    kernels: tuple[KernelResources, ...] = ()  # per kernel per SASS arch (kforge.doctor.resources)

    @property
    def is_cuda(self) -> bool:
        return bool(self.fatbins)

    @property
    def sass(self) -> tuple[FatbinEntry, ...]:
        return tuple(e for e in self.fatbins if e.kind == SASS)

    @property
    def ptx(self) -> tuple[FatbinEntry, ...]:
        return tuple(e for e in self.fatbins if e.kind == PTX)

    @property
    def sass_archs(self) -> tuple[str, ...]:
        return _sorted_names(e for e in self.sass)

    @property
    def ptx_archs(self) -> tuple[str, ...]:
        return _sorted_names(e for e in self.ptx)

    @property
    def debug_sections(self) -> tuple[SectionSize, ...]:
        """Its host debug info sections (``.debug_info``, ``.debug_str``, ...), largest first."""
        return tuple(sorted((s for s in self.sections if is_debug_section(s.name)), key=lambda s: (-s.size, s.name)))

    @property
    def linked_binary_symbols(self) -> tuple[str, ...]:
        """Undefined ``__cudaRegisterLinkedBinary_*``: built with ``-rdc=true`` but never device-linked."""
        return tuple(s for s in self.undefined_symbols if s.startswith("__cudaRegisterLinkedBinary_"))


def _sorted_names(entries) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    seen = {e.arch: e.cuda_arch for e in entries}
    return tuple(sorted(seen, key=lambda name: seen[name]))


@dataclass(frozen=True)
class WheelReport:
    """Every binary of one wheel, plus the wheel's identity."""

    path: str
    filename: str
    name: str
    version: str
    tags: tuple[str, ...]
    size: int
    sha256: str
    binaries: tuple[BinaryReport, ...] = ()
    files: tuple[str, ...] = field(default=(), repr=False)

    @property
    def cuda_binaries(self) -> tuple[BinaryReport, ...]:
        return tuple(b for b in self.binaries if b.is_cuda)


@dataclass(frozen=True)
class Finding:
    """One thing :func:`kforge.doctor.check` found. ``severity`` is error, warning or info."""

    severity: str
    code: str
    message: str
    binary: str | None = None
    arch: str | None = None
    wheel: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"
