"""The CUDA arch table and everything derived from it.

One table (:data:`KNOWN_ARCHS`) holds every fact kforge uses about a GPU architecture:
its name, the first CUDA that compiles it, which ``a`` (arch-specific) and ``f`` (family)
variants exist and from which CUDA, and the last CUDA that still knows it. Parsing,
toolchain checks and the upstream knob renderers (:mod:`kforge.cuda.render`, which imports this module, never
the reverse) all read it;
no other module repeats a minimum-CUDA fact.

Sources for the table: ``/work/shared/UPSTREAM_FACTS.md`` ("Minimum CUDA per
architecture"), and ``nvcc --list-gpu-arch`` of CUDA 13.0.88 on the build machine, which
lists ``compute_75 80 86 87 88 89 90 100 110 103 120 121`` and accepts exactly the
``a``/``f`` variants below (checked by ``tests/integration/test_arch_nvcc.py``).
Choices made where the sources are silent:

* sm_88: CUDA 13.0 is the first nvcc that lists ``compute_88`` (LLVM's NVPTX target also
  ties sm_88 to PTX ISA 9.0, i.e. CUDA 13.0), so its minimum is 13.0. It has no variants.
* sm_101: its ``f`` variant comes with the other ``f`` variants in CUDA 12.9 (PTX ISA 8.8);
  CUDA 13.0 renamed sm_101 to sm_110, so 12.9 is the last CUDA that knows it.
* Versions compare on major.minor only: CUDA 12.8.1 counts as 12.8.
* CUDA 13.0 dropped sm_72 and older; they are not in the table, and parsing them says so.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from packaging.version import InvalidVersion, Version

from kforge.errors import ArchError, ToolchainError, did_you_mean

VARIANTS = ("", "a", "f")
"""Every variant suffix: none, ``a`` (arch-specific features), ``f`` (family-portable)."""

SASS, PTX, LTO = "sass", "ptx", "lto"
"""Kinds of device code for an arch: machine code (``sm_90a``), PTX (``compute_90a``), LTO IR (``lto_90a``)."""


@dataclass(frozen=True)
class ArchInfo:
    """One row of the arch table, keyed by ``major*10 + minor``."""

    number: int
    name: str
    min_cuda: Version
    variants: frozenset[str]
    min_cuda_variant: Mapping[str, Version] = field(compare=False)
    max_cuda: Version | None = None
    """The last CUDA (major.minor, inclusive) that knows this arch; ``None``: still current."""
    renamed_to: int | None = None
    """The arch number that replaced this one after :attr:`max_cuda`."""

    @property
    def sm(self) -> str:
        return f"sm_{self.number}"


def _row(
    number: int,
    name: str,
    min_cuda: str,
    *,
    a: str | None = None,
    f: str | None = None,
    max_cuda: str | None = None,
    renamed_to: int | None = None,
) -> ArchInfo:
    per_variant = {v: Version(c) for v, c in (("a", a), ("f", f)) if c is not None}
    return ArchInfo(
        number=number,
        name=name,
        min_cuda=Version(min_cuda),
        variants=frozenset(per_variant),
        min_cuda_variant=MappingProxyType(per_variant),
        max_cuda=Version(max_cuda) if max_cuda else None,
        renamed_to=renamed_to,
    )


# THE table. Nothing else in kforge states a minimum CUDA for an arch.
KNOWN_ARCHS: Mapping[int, ArchInfo] = MappingProxyType(
    {
        r.number: r
        for r in (
            _row(75, "Turing (T4, RTX 20xx)", "10.0"),
            _row(80, "Ampere A100/A30", "11.0"),
            _row(86, "Ampere GA10x (RTX 30xx, A10, A40)", "11.1"),
            _row(87, "Ampere Jetson Orin", "11.4"),
            _row(88, "Ada-class sm_88 (new in CUDA 13.0)", "13.0"),
            _row(89, "Ada Lovelace (RTX 40xx, L4, L40)", "11.8"),
            _row(90, "Hopper (H100/H200)", "11.8", a="12.0"),
            _row(100, "Blackwell B200/GB200", "12.8", a="12.8", f="12.9"),
            _row(
                101, "Blackwell Jetson Thor (before CUDA 13.0)", "12.8", a="12.8", f="12.9",
                max_cuda="12.9", renamed_to=110,
            ),
            _row(103, "Blackwell Ultra B300/GB300", "12.9", a="12.9", f="12.9"),
            _row(110, "Blackwell Jetson Thor", "13.0", a="13.0", f="13.0"),
            _row(120, "Blackwell RTX 50xx / RTX PRO 6000", "12.8", a="12.8", f="12.9"),
            _row(121, "Blackwell DGX Spark (GB10)", "12.9", a="12.9", f="12.9"),
        )
    }
)

LEGACY_ARCHS = frozenset({20, 21, 30, 32, 35, 37, 50, 52, 53, 60, 61, 62, 70, 72})
"""Real archs that CUDA 13.0 (or an earlier CUDA) dropped; kforge does not build for them."""


def _known_list() -> str:
    return ", ".join(info.sm for info in KNOWN_ARCHS.values())


def _variants_text(info: ArchInfo) -> str:
    names = [info.sm] + [f"{info.sm}{v}" for v in VARIANTS if v in info.variants]
    return ", ".join(names)


def _check_known(major: int, minor: int, variant: str, text: str | None = None) -> None:
    shown = text if text is not None else f"sm_{major * 10 + minor}{variant}"
    if variant not in VARIANTS:
        hint = did_you_mean(f"sm_{major * 10 + minor}", [i.sm for i in KNOWN_ARCHS.values()])
        raise ArchError(
            f"'{shown}' has an unknown variant suffix '{variant}'{hint}",
            why="a CUDA arch is a number optionally followed by 'a' (arch-specific) or 'f' (family)",
            fix="write it like sm_90a, 12.0f or 120",
        )
    if not (0 <= minor <= 9) or major < 1:
        raise ArchError(f"'{shown}' is not a CUDA arch", why=f"kforge knows {_known_list()}")
    number = major * 10 + minor
    info = KNOWN_ARCHS.get(number)
    if info is None:
        if number in LEGACY_ARCHS:
            raise ArchError(
                f"sm_{number} ('{shown}') is no longer supported",
                why="CUDA 13.0 dropped sm_72 and older (Volta, Pascal, Maxwell, Kepler), "
                "and kforge builds only for archs current CUDA can target",
                fix=f"use one of {_known_list()}, or build sm_{number} with an older toolchain outside kforge",
            )
        hint = did_you_mean(f"sm_{number}", [i.sm for i in KNOWN_ARCHS.values()])
        raise ArchError(
            f"unknown CUDA arch '{shown}'{hint}",
            why=f"kforge knows {_known_list()}",
            fix="use one of those (spellings like sm_90a, 9.0a, 90a and compute_90a all work)",
        )
    if variant and variant not in info.variants:
        has = _variants_text(info)
        raise ArchError(
            f"{info.sm} has no '{variant}' variant ('{shown}')",
            why=f"{info.sm} ({info.name}) exists as {has}"
            + ("" if info.variants else " only"),
            fix=f"use {has.split(', ')[-1] if info.variants else info.sm}",
        )


@dataclass(frozen=True, order=True)
class Arch:
    """One GPU architecture, e.g. ``sm_120a``: the one arch type of kforge.

    ``ptx``: a build embeds PTX for it besides SASS (``90+PTX``). The constructor checks the
    arch against :data:`KNOWN_ARCHS`; :meth:`observed` builds one read from a binary, which
    may be outside the table (``sm_70`` in an old wheel) and is only checked for its shape.
    """

    major: int
    minor: int
    variant: str = ""
    ptx: bool = False
    known: bool = field(default=True, compare=False, repr=False)
    """False for an arch read from a binary (:meth:`observed`), which the table need not list."""

    def __post_init__(self) -> None:
        if self.known:
            _check_known(self.major, self.minor, self.variant)
        elif self.variant not in VARIANTS or not (0 <= self.minor <= 9) or self.major < 1:
            raise ArchError(f"sm_{self.major}{self.minor}{self.variant} is not a CUDA arch",
                            why="an arch is a major >= 1, a minor 0-9 and an optional 'a' or 'f'")

    @classmethod
    def observed(cls, major: int, minor: int, variant: str = "") -> Arch:
        """An arch as a binary names it (a fatbin entry): not checked against the table."""
        return cls(major, minor, variant, known=False)

    @property
    def number(self) -> int:
        """``major*10 + minor`` without the variant: ``120`` for ``sm_120a``, the key into :data:`KNOWN_ARCHS`."""
        return self.major * 10 + self.minor

    @property
    def suffixed(self) -> str:
        """The number with its variant suffix: ``"120a"`` (CMake's and nvcc's spelling after ``sm_``)."""
        return f"{self.number}{self.variant}"

    @property
    def sm(self) -> str:
        return f"sm_{self.suffixed}"

    @property
    def compute(self) -> str:
        return f"compute_{self.suffixed}"

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}{self.variant}"

    @property
    def info(self) -> ArchInfo:
        info = KNOWN_ARCHS.get(self.number)
        if info is None:
            _check_known(self.major, self.minor, self.variant)  # raises the table's error
        return KNOWN_ARCHS[self.number]

    @property
    def base(self) -> Arch:
        return Arch(self.major, self.minor, known=self.known)

    @property
    def min_cuda(self) -> Version:
        """The oldest CUDA whose nvcc compiles exactly this arch and variant."""
        info = self.info
        return info.min_cuda_variant[self.variant] if self.variant else info.min_cuda

    @property
    def max_cuda(self) -> Version | None:
        return self.info.max_cuda

    def with_variant(self, variant: str) -> Arch:
        return replace(self, variant=variant)

    def with_ptx(self, ptx: bool = True) -> Arch:
        return replace(self, ptx=ptx)

    def __str__(self) -> str:
        return self.sm


# ---------------------------------------------------------------------------------------
# Parsing

_SPELLING = re.compile(
    r"""^(?:(?P<prefix>sm|compute|lto)_?)?
        (?:(?P<major>\d{1,2})\.(?P<minor>\d)|(?P<number>\d{2,3}))
        (?P<variant>[a-z])?
        (?P<ptx>\+ptx)?$""",
    re.VERBOSE,
)


def _spellings() -> list[str]:
    out: list[str] = []
    for info in KNOWN_ARCHS.values():
        for v in VARIANTS:
            if v == "" or v in info.variants:
                n = f"{info.number}{v}"
                out += [f"sm_{n}", n, f"{info.number // 10}.{info.number % 10}{v}"]
    return out


def parse_arch(text: str) -> Arch:
    """Parse any spelling of one arch: ``sm_120a``, ``SM120``, ``12.0f``, ``compute_90a``, ``lto_90``, ``9.0+PTX``.

    ``compute_X`` (and ``lto_X``) name the same arch as ``sm_X``: the prefix does not imply PTX
    (add ``+PTX``); :func:`code_kind` says which kind of device code a prefix names.
    """
    if not isinstance(text, str):
        raise ArchError(f"a CUDA arch must be text like 'sm_90a', not {type(text).__name__} {text!r}")
    cleaned = text.strip().lower().replace("-", "_")
    m = _SPELLING.match(cleaned)
    if m is None or (m["prefix"] and m["major"] is not None):
        hint = did_you_mean(cleaned, _spellings())
        raise ArchError(
            f"cannot read '{text}' as a CUDA arch{hint}",
            why=f"an arch is written like sm_90a, 90a, 9.0a or compute_90a (optionally +PTX); kforge knows {_known_list()}",
            fix="fix the spelling in forge.toml or on the command line",
        )
    if m["number"] is not None:
        major, minor = divmod(int(m["number"]), 10)
    else:
        major, minor = int(m["major"]), int(m["minor"])
    variant = m["variant"] or ""
    _check_known(major, minor, variant, text.strip())
    return Arch(major, minor, variant, ptx=bool(m["ptx"]))


def code_kind(text: str) -> str | None:
    """The kind of device code a spelling names: :data:`SASS` for ``sm_``, :data:`PTX` for ``compute_``,
    :data:`LTO` for ``lto_``, ``None`` for a bare number (``90a``, ``9.0``)."""
    low = text.strip().lower()
    for prefix, kind in (("sm", SASS), ("compute", PTX), ("lto", LTO)):
        if low.startswith(prefix):
            return kind
    return None


def parse_arch_list(value: str | Sequence[str]) -> tuple[Arch, ...]:
    """Parse ``"80;90a;120"``, ``"8.0 9.0a 12.0f"``, ``"sm_80,sm_90a"`` or a list of those.

    Duplicates are dropped, first occurrence wins its place; ``90`` and ``90+PTX`` merge into
    one arch that carries PTX.
    """
    items = [value] if isinstance(value, str) else list(value)
    out: dict[tuple[int, int, str], Arch] = {}
    for item in items:
        for token in re.split(r"[;,\s]+", item if isinstance(item, str) else str(item)):
            if not token:
                continue
            arch = parse_arch(token)
            key = (arch.major, arch.minor, arch.variant)
            if key in out:
                if arch.ptx and not out[key].ptx:
                    out[key] = out[key].with_ptx()
            else:
                out[key] = arch
    if not out:
        raise ArchError(
            f"the arch list {value!r} is empty",
            fix="name at least one arch, e.g. '80;90a;120'",
        )
    return tuple(out.values())


def host_arch(capability: tuple[int, int]) -> Arch:
    """The arch to build for a GPU of compute capability ``(major, minor)``: the base arch."""
    major, minor = capability
    return Arch(int(major), int(minor))


def all_archs() -> tuple[Arch, ...]:
    """Every arch and variant in the table, in table order (base, then ``a``, then ``f``)."""
    return tuple(
        Arch(info.number // 10, info.number % 10, v)
        for info in KNOWN_ARCHS.values()
        for v in VARIANTS
        if v == "" or v in info.variants
    )


# ---------------------------------------------------------------------------------------
# Toolchain support


def as_cuda_version(cuda: Version | str) -> Version:
    """``"12.8"``, ``"12.8.1"``, ``"cu128"``, ``"V13.0.88"`` or a Version -> ``Version("12.8")``."""
    if isinstance(cuda, Version):
        v = cuda
    else:
        s = str(cuda).strip().lower()
        m = re.fullmatch(r"cu(\d{2,3})", s)
        if m:
            digits = m[1]
            s = f"{digits[:-1]}.{digits[-1]}"
        try:
            v = Version(s.lstrip("v"))
        except InvalidVersion:
            raise ToolchainError(
                f"'{cuda}' is not a CUDA version",
                fix="write it like 12.8, 13.0 or cu128",
            ) from None
    release = (*v.release, 0)[:2]
    return Version(f"{release[0]}.{release[1]}")


def _nvcc_has(arch: Arch, nvcc_archs: Collection[str]) -> bool:
    return arch.base.compute in nvcc_archs or arch.base.sm in nvcc_archs


def unsupported_reason(
    arch: Arch,
    cuda: Version | str,
    *,
    nvcc_archs: Collection[str] | None = None,
    source: str = "nvcc",
) -> ToolchainError | None:
    """Why ``cuda`` cannot compile ``arch`` (as the error to raise), or ``None`` when it can.

    With ``nvcc_archs`` (what ``nvcc --list-gpu-arch`` printed) the list decides whether the
    base arch exists; the table still decides the ``a``/``f`` variants.
    """
    v = as_cuda_version(cuda)
    info = arch.info
    listed = None if nvcc_archs is None else _nvcc_has(arch, nvcc_archs)
    if info.max_cuda is not None and v > info.max_cuda and not listed:
        new = Arch(info.renamed_to // 10, info.renamed_to % 10, arch.variant) if info.renamed_to else None
        renamed = f"; CUDA {_next_minor(info.max_cuda)} renamed it {new}" if new else ""
        return ToolchainError(
            f"{arch} is not available in CUDA {v}: CUDA {info.max_cuda} is the last that knows it{renamed}",
            why=f"the selected {source} is CUDA {v}",
            fix=(f"build {new} instead (or use CUDA {info.max_cuda} for {arch})" if new else
                 f"use CUDA {info.max_cuda} or older for {arch}"),
        )
    base_ok = (v >= info.min_cuda) if listed is None else listed
    if (not base_ok and v < arch.min_cuda) or (base_ok and v < arch.min_cuda and arch.variant):
        needed = arch.min_cuda
        return ToolchainError(
            f"{arch} needs CUDA {needed} or newer, and the selected {source} is CUDA {v}",
            why=f"CUDA {v} has no {arch.compute}",
            fix=f"install CUDA >= {needed} and point CUDA_HOME at it "
            f"(kforge provisions CUDA >= 13.0 from PyPI with --cuda 13.0), or drop {arch} from the arch list",
        )
    if not base_ok:  # the table says CUDA v has it, but this nvcc does not list it
        shown = ", ".join(sorted(nvcc_archs or (), key=_arch_sort_key)) or "nothing"
        return ToolchainError(
            f"{arch} is not supported by the selected {source} (CUDA {v})",
            why=f"`{source} --list-gpu-arch` does not list {arch.base.compute}; it lists {shown}",
            fix=f"use an nvcc that lists {arch.base.compute}, or drop {arch} from the arch list",
        )
    return None


def _next_minor(v: Version) -> str:
    # CUDA majors end at x.9 so far (12.9 -> 13.0); good enough for naming the next release.
    return f"{v.major + 1}.0" if v.minor >= 9 else f"{v.major}.{v.minor + 1}"


def _arch_sort_key(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)([a-z]?)$", name)
    return (int(m[1]), m[2]) if m else (0, name)


def cuda_supports(arch: Arch, cuda: Version | str) -> bool:
    """Whether CUDA ``cuda`` (by the table alone) can compile ``arch`` with its variant."""
    return unsupported_reason(arch, cuda) is None


def supported_archs(cuda: Version | str, *, variants: bool = False) -> tuple[Arch, ...]:
    """Every table arch CUDA ``cuda`` compiles (base archs only unless ``variants``)."""
    return tuple(a for a in all_archs() if (variants or not a.variant) and cuda_supports(a, cuda))


def require_supported(
    archs: Iterable[Arch],
    cuda: Version | str,
    *,
    nvcc_archs: Collection[str] | None = None,
    source: str = "nvcc",
) -> None:
    """Raise :class:`ToolchainError` for the first arch that ``cuda``/``nvcc_archs`` cannot compile."""
    for arch in archs:
        err = unsupported_reason(arch, cuda, nvcc_archs=nvcc_archs, source=source)
        if err is not None:
            raise err


@dataclass(frozen=True)
class Dropped:
    """An arch :func:`filter_supported` removed, and why (the reason names the CUDA it needs)."""

    arch: Arch
    reason: str


def filter_supported(
    archs: Iterable[Arch],
    cuda: Version | str,
    *,
    nvcc_archs: Collection[str] | None = None,
) -> tuple[tuple[Arch, ...], tuple[Dropped, ...]]:
    """Split ``archs`` into those ``cuda`` compiles and those it cannot (with reasons)."""
    kept: list[Arch] = []
    dropped: list[Dropped] = []
    for arch in archs:
        err = unsupported_reason(arch, cuda, nvcc_archs=nvcc_archs)
        if err is None:
            kept.append(arch)
        else:
            dropped.append(Dropped(arch, err.what))
    return tuple(kept), tuple(dropped)


__all__ = [
    "KNOWN_ARCHS", "LEGACY_ARCHS", "LTO", "PTX", "SASS", "VARIANTS", "Arch", "ArchInfo", "Dropped", "all_archs",
    "as_cuda_version", "code_kind", "cuda_supports", "filter_supported", "host_arch", "parse_arch",
    "parse_arch_list", "require_supported", "supported_archs", "unsupported_reason",
]
