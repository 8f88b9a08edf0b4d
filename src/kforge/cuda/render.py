"""Renderers: one arch set, written in each upstream knob's own format.

The ``render_*`` functions take a sequence of :class:`~kforge.cuda.arch.Arch` (already parsed and
checked) and return the exact string (or flags) the upstream build reads. They are pure; the
suffix rules they need come from :mod:`kforge.cuda.arch` (this module imports it, never the reverse).

``RENDERERS`` maps each format name forge.toml uses (``arch_knobs[].format``) to a renderer with
the one signature :data:`Renderer`: ``(archs, knob, cuda, ptx) -> {variable: value}``. :func:`render_knob`
is the one dispatch through it; ``ptx`` is the build's PTX policy (kforge.config.binarypolicy), which the
formats that can say PTX (gencode, torch, cmake) follow and the others (numbers, flashinfer, disable-flags)
cannot express: there the upstream decides, and kforge's nvcc wrapper brings it in line.

PTX policy (``ptx=``) for the renderers that can embed PTX (gencode, torch, cmake):

* ``"last"`` (default): PTX for the highest arch of the list, plus any arch parsed with ``+PTX``;
* ``True``: PTX for every arch;
* ``False``: PTX only for archs parsed with ``+PTX``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Literal, Protocol

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from kforge.cuda.arch import KNOWN_ARCHS, Arch, as_cuda_version
from kforge.errors import ArchError, ToolchainError, did_you_mean

PtxPolicy = bool | Literal["last"]

CMAKE_FAMILY_SUFFIX_MIN = Version("4.0")
"""First CMake whose CMAKE_CUDA_ARCHITECTURES accepts ``f`` (``100f``): checked here, 3.25.1 and
3.31.6 reject ``100f-real`` at configure time, 4.0.3 and 4.1.2 accept it. ``a`` (``90a``)
is accepted by all four."""


def _dedupe(archs: Iterable[Arch]) -> list[Arch]:
    seen: dict[tuple[int, int, str], Arch] = {}
    for a in archs:
        if not isinstance(a, Arch):
            raise ArchError(f"expected a parsed arch, got {a!r}", fix="parse it with kforge.cuda.arch.parse_arch")
        key = (a.major, a.minor, a.variant)
        if key not in seen:
            seen[key] = a
        elif a.ptx:
            seen[key] = seen[key].with_ptx()
    return list(seen.values())


def _plan(archs: Sequence[Arch], ptx: PtxPolicy) -> list[tuple[Arch, bool, bool]]:
    """Each arch with (SASS?, PTX?) under the ``ptx`` policy.

    A plain arch whose ``f`` variant is also listed gets no SASS of its own: nvcc 13.0 refuses
    ``code=sm_100`` next to ``code=sm_100f`` ("The same GPU code (`sm_100f`) generated for non
    family-specific and family-specific GPU arch"), and the ``f`` SASS runs on that GPU anyway.
    """
    if ptx not in (True, False, "last"):
        raise ArchError(f"unknown PTX policy {ptx!r}", fix="use true, false or \"last\"")
    items = _dedupe(archs)
    if not items:
        raise ArchError("the arch list is empty", fix="name at least one arch, e.g. '80;90a;120'")
    highest = max(items, key=lambda a: (a.major, a.minor, a.variant)) if ptx == "last" else None
    family = {a.number for a in items if a.variant == "f"}
    return [
        (a, not (a.variant == "" and a.number in family), a.ptx or ptx is True or a is highest)
        for a in items
    ]


def render_gencode(archs: Sequence[Arch], *, ptx: PtxPolicy = "last") -> tuple[str, ...]:
    """nvcc flags: ``-gencode=arch=compute_90a,code=sm_90a``, plus ``code=compute_X`` for PTX."""
    flags: list[str] = []
    for a, sass, with_ptx in _plan(archs, ptx):
        if sass:
            flags.append(f"-gencode=arch={a.compute},code={a.sm}")
        if with_ptx:
            flags.append(f"-gencode=arch={a.compute},code={a.compute}")
    return tuple(flags)


def render_numbers(archs: Sequence[Arch], sep: str = ";") -> str:
    """``FLASH_ATTN_CUDA_ARCHS`` style: ``80;90;120``. Variants and PTX are dropped (upstream picks them)."""
    numbers: list[str] = []
    for a in _dedupe(archs):
        if str(a.number) not in numbers:
            numbers.append(str(a.number))
    return sep.join(numbers)


TORCH_UNKNOWN = frozenset({88})
"""Arch numbers torch's TORCH_CUDA_ARCH_LIST rejects. Checked on the GPU host with torch 2.11.0+cu130:
it takes 8.7, 9.0a, 10.0a, 10.3a, 11.0a, 12.0a, 12.1a, 12.0+PTX and 9.0a+PTX, and raises
"Unknown CUDA arch" for 8.8 and for every ``f`` variant (10.0f, 10.3f, 11.0f, 12.0f, 12.1f)."""


def render_torch_arch_list(archs: Sequence[Arch], *, ptx: PtxPolicy = "last") -> str:
    """``TORCH_CUDA_ARCH_LIST``: ``8.0;9.0a;12.0+PTX`` (torch adds PTX for entries with ``+PTX``)."""
    out: list[str] = []
    for a, _sass, p in _plan(archs, ptx):  # no 'f' gets through, so every entry keeps its SASS
        if a.variant == "f" or a.number in TORCH_UNKNOWN:
            instead = a.with_variant("a") if "a" in a.info.variants else None
            raise ArchError(
                f"TORCH_CUDA_ARCH_LIST cannot name {a.dotted} ({a})",
                why="torch's cpp_extension (checked with torch 2.11.0) knows no family ('f') archs and "
                "no 8.8, and fails the build with 'Unknown CUDA arch'",
                fix=(f"ask for {instead} or {a.base} for this project" if instead else f"drop {a} for this project")
                + ", or give it an arch knob in the gencode format",
            )
        out.append(a.dotted + ("+PTX" if p else ""))
    return ";".join(out)


def render_cmake_architectures(
    archs: Sequence[Arch], *, ptx: PtxPolicy = "last", cmake: Version | str | None = None
) -> str:
    """``CMAKE_CUDA_ARCHITECTURES``: ``80-real;90a-real;120a`` (no ``-real``: SASS and PTX).

    With ``cmake`` (the CMake version that will read it), an ``f`` arch on a CMake older than
    :data:`CMAKE_FAMILY_SUFFIX_MIN` raises :class:`ToolchainError` instead of a configure failure.
    """
    items = _plan(archs, ptx)
    if cmake is not None:
        cm = Version(str(cmake))
        family = [a for a, _, _ in items if a.variant == "f"]
        if family and cm < CMAKE_FAMILY_SUFFIX_MIN:
            raise ToolchainError(
                f"CMake {cm} cannot take {family[0].suffixed} in CMAKE_CUDA_ARCHITECTURES",
                why=f"CMake accepts family ('f') archs there from {CMAKE_FAMILY_SUFFIX_MIN} on; older "
                "versions only accept plain numbers and 'a'",
                fix=f"use CMake >= {CMAKE_FAMILY_SUFFIX_MIN} (pip install 'cmake>={CMAKE_FAMILY_SUFFIX_MIN}'), "
                f"or use {family[0].with_variant('a').suffixed} or {family[0].base.suffixed} instead",
            )
    suffix = {(True, True): "", (True, False): "-real", (False, True): "-virtual"}
    return ";".join(a.suffixed + suffix[sass, p] for a, sass, p in items if sass or p)


FLASHINFER_RULE_VALID_FOR = SpecifierSet(">=0.6,<0.7")
"""The FlashInfer versions whose suffix rule :func:`default_variant` follows, read from
``flashinfer/compilation_context.py`` (``CompilationContext._normalize_cuda_arch``) at v0.6.17
(a0a6b019). Older pins followed another rule (04d0710: 12.x -> ``f`` only from CUDA 13, 12.1
collapsed to 12.0). ``kforge plan`` refuses a project with ``variant_rule = "flashinfer"`` whose
``upstream_version`` is outside this range: re-read that file at the new pin, then widen it."""

FLASHINFER_FAMILY_FROM = KNOWN_ARCHS[120].min_cuda_variant["f"]
"""FlashInfer 0.6.x: a bare 12.0 becomes ``12.0f`` from the first CUDA that has ``compute_120f`` (12.9, from
the arch table), and a bare 12.x raises "SM 12.x requires CUDA >= 12.9" below that."""


def default_variant(arch: Arch, cuda: Version | str) -> Arch:
    """FlashInfer 0.6.x's rule for an arch given without a suffix, for CUDA ``cuda``.

    9.x -> ``a``; 12.0 -> ``f`` and other 12.x -> ``a`` (12.1 -> ``121a``: each 12.x minor gets
    its own cubin); other >= 10 -> ``a``; below 9 -> none. An explicit variant is kept (upstream
    keeps it too). Below CUDA 12.9 upstream raises for a bare 12.x; kforge names ``12.0a``
    explicitly instead, which upstream passes through (its own cu12.8 release list does the same).
    When the table says the picked variant does not exist (or needs a newer CUDA), the base arch
    is returned. Holds for :data:`FLASHINFER_RULE_VALID_FOR`.
    """
    if arch.variant:
        return arch
    v = as_cuda_version(cuda)
    if arch.major == 9:
        pick = "a"
    elif arch.major == 12:
        pick = "f" if arch.minor == 0 and v >= FLASHINFER_FAMILY_FROM else "a"
    elif arch.major >= 10:
        pick = "a"
    else:
        pick = ""
    if not pick or pick not in arch.info.variants or v < arch.info.min_cuda_variant[pick]:
        return arch
    return arch.with_variant(pick)


def render_flashinfer(archs: Sequence[Arch], cuda: Version | str) -> str:
    """``FLASHINFER_CUDA_ARCH_LIST``: ``8.0 9.0a 12.0f`` (space separated, FlashInfer's default suffixes).

    A plain arch is left out when its ``f`` variant is listed (nvcc refuses both at once).
    """
    chosen = _dedupe(default_variant(a, cuda) for a in _dedupe(archs))
    family = {a.number for a in chosen if a.variant == "f"}
    return " ".join(a.dotted for a in chosen if a.variant or a.number not in family)


def render_disable_flags(
    archs: Sequence[Arch], families: Mapping[str, Collection[int]], prefix: str
) -> dict[str, str]:
    """FlashMLA style: ``{prefix+family: "1"}`` for every family with none of ``archs`` in it.

    ``families={"SM90": {90}, "SM100": {100, 103}}, prefix="FLASH_MLA_DISABLE_"`` and archs
    ``sm_120`` -> ``{"FLASH_MLA_DISABLE_SM90": "1", "FLASH_MLA_DISABLE_SM100": "1"}``.
    """
    wanted = {a.number for a in _dedupe(archs)}
    return {f"{prefix}{name}": "1" for name, members in families.items() if not wanted & set(members)}


class KnobSpec(Protocol):
    """What a renderer reads from one ``arch_knobs`` entry (:class:`kforge.config.model.ArchKnob` is one)."""

    @property
    def format(self) -> str: ...
    @property
    def env(self) -> str | None: ...
    @property
    def prefix(self) -> str | None: ...
    @property
    def value(self) -> str: ...
    @property
    def families(self) -> Mapping[str, tuple[int, ...]]: ...
    @property
    def only(self) -> tuple[int, ...] | None: ...


Renderer = Callable[[Sequence[Arch], KnobSpec, Version, PtxPolicy], dict[str, str]]
"""The one renderer signature: the build's arch set, the knob, the CUDA it builds with, the PTX policy -> the
variables to set."""


def _only(archs: Sequence[Arch], knob: KnobSpec) -> tuple[Arch, ...]:
    return tuple(a for a in archs if knob.only is None or a.number in knob.only)


def _variable(value: Callable[[tuple[Arch, ...], Version, PtxPolicy], str]) -> Renderer:
    """A renderer for a knob that is one variable (``knob.env``), fed the archs ``knob.only`` keeps."""

    def render(archs: Sequence[Arch], knob: KnobSpec, cuda: Version, ptx: PtxPolicy = "last") -> dict[str, str]:
        chosen = _only(archs, knob)
        return {knob.env or "": value(chosen, cuda, ptx)} if chosen else {}

    render.__doc__ = value.__doc__
    return render


def _disable_flags(archs: Sequence[Arch], knob: KnobSpec, cuda: Version, ptx: PtxPolicy = "last") -> dict[str, str]:
    """``{prefix+family: knob.value}`` for every family none of ``archs`` is in (see :func:`render_disable_flags`)."""
    return {name: knob.value for name in render_disable_flags(archs, knob.families, knob.prefix or "")}


RENDERERS: Mapping[str, Renderer] = MappingProxyType(
    {
        "gencode": _variable(lambda archs, cuda, ptx: " ".join(render_gencode(archs, ptx=ptx))),
        "numbers": _variable(lambda archs, cuda, ptx: render_numbers(archs)),
        "torch": _variable(lambda archs, cuda, ptx: render_torch_arch_list(archs, ptx=ptx)),
        "cmake": _variable(lambda archs, cuda, ptx: render_cmake_architectures(archs, ptx=ptx)),
        "flashinfer": _variable(lambda archs, cuda, ptx: render_flashinfer(archs, cuda)),
        "disable-flags": _disable_flags,
    }
)


def render_knob(knob: KnobSpec, archs: Sequence[Arch], cuda: Version | str, *, ptx: PtxPolicy = "last") -> dict[str, str]:
    """One arch knob of a project, rendered for the build's arch set and PTX policy through :data:`RENDERERS`."""
    renderer = RENDERERS.get(knob.format)
    if renderer is None:
        raise ArchError(
            f"arch knob format '{knob.format}' has no renderer{did_you_mean(knob.format, RENDERERS)}",
            fix=f"use one of: {', '.join(RENDERERS)}",
        )
    return renderer(archs, knob, as_cuda_version(cuda), ptx)
