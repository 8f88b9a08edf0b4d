"""Result types of the wheel doctor, and the CUDA arch spelling it reads and writes.

Everything here is a frozen dataclass, so a report can be compared, hashed, stored in a
manifest (:func:`kforge.doctor.render.to_json`) and handed from step to step unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kforge.errors import ArchError

#: Kinds of payload in a fatbin: device code (SASS in a cubin ELF), PTX text, LTO IR.
SASS, PTX, LTO = "sass", "ptx", "lto"

_ARCH_RE = re.compile(r"^(?:(?P<prefix>sm|compute|lto)_)?(?P<num>\d{2,3}|\d{1,2}\.\d)(?P<variant>[af]?)$")


@dataclass(frozen=True, order=True)
class CudaArch:
    """A compute capability with its suffix: ``sm_90a`` is ``CudaArch(9, 0, "a")``.

    ``variant`` is ``""`` (portable within its major version), ``"a"`` (arch-specific:
    runs only on exactly this compute capability) or ``"f"`` (family-specific: runs on
    this compute capability and later minors of the same family).
    """

    major: int
    minor: int
    variant: str = ""

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    @property
    def sm(self) -> str:
        return f"sm_{self.number}{self.variant}"

    @property
    def compute(self) -> str:
        return f"compute_{self.number}{self.variant}"

    def __str__(self) -> str:
        return self.sm


def parse_arch(text: str) -> tuple[str | None, CudaArch]:
    """Parse ``sm_90a``, ``compute_120f``, ``90a``, ``9.0a`` or ``120``.

    Returns ``(kind, arch)`` where kind is :data:`SASS` for an ``sm_`` prefix, :data:`PTX`
    for ``compute_``, :data:`LTO` for ``lto_`` and ``None`` for a bare number.
    """
    m = _ARCH_RE.match(text.strip().lower())
    if not m:
        raise ArchError(
            f"'{text}' is not a CUDA arch",
            why="kforge reads arches as sm_XY[a|f], compute_XY[a|f], XY[a|f] or X.Y[a|f]",
            fix="write it like sm_90a, compute_120f, 90a or 12.0f",
        )
    num = m.group("num")
    if "." in num:
        major_s, minor_s = num.split(".")
        major, minor = int(major_s), int(minor_s)
    else:
        major, minor = divmod(int(num), 10)
    prefix = m.group("prefix")
    kind = {"sm": SASS, "compute": PTX, "lto": LTO}.get(prefix) if prefix else None
    return kind, CudaArch(major, minor, m.group("variant"))


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
    def cuda_arch(self) -> CudaArch:
        return CudaArch(self.major, self.minor, self.variant)


@dataclass(frozen=True)
class SectionSize:
    name: str
    size: int


@dataclass(frozen=True)
class KernelResources:
    """One kernel of one cubin: what a launch of it needs (read by :mod:`kforge.doctor.resources`).

    ``static_smem`` excludes the shared memory the driver reserves per block (``reserved_smem``);
    ``dynamic_smem`` is what the launcher declares in a kforge launch manifest, None when undeclared;
    ``max_threads`` is the block size its launch bounds declare, None without them.
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
