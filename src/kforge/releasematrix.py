"""A project's release matrix: archs x variants, less excludes, as forge.toml declares it (``[projects.X.release]``).

The ``*Table`` dataclasses are the file's shape (kforge.schema reads them); :func:`read_release` checks the
domain (archs the project has, versions that parse, no torch for a torch-free project) and gives the frozen
:class:`Release`. :func:`expand` turns it into the builds, one (arch, variant) each, with the host's Python
filling in a variant that names none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from packaging.version import Version

from kforge.arch import Arch, parse_arch
from kforge.errors import ArchError, ConfigError
from kforge.variant import Variant, parse_python, parse_version


@dataclass(frozen=True)
class VariantTable:
    cuda: str
    torch: str | None = None  # torch-ABI projects: required
    python: str | None = None  # default: the Python kforge runs under


@dataclass(frozen=True)
class ReleaseRuleTable:
    arch: tuple[str, ...] | None = None
    cuda: tuple[str, ...] | None = None
    torch: tuple[str, ...] | None = None
    python: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ReleaseTable:
    archs: tuple[str, ...]
    variants: tuple[VariantTable, ...]
    exclude: tuple[ReleaseRuleTable, ...] = ()


@dataclass(frozen=True)
class ReleaseVariant:
    cuda: Version
    torch: Version | None
    python: str | None  # None: the host's

    def resolve(self, host_python: str) -> Variant:
        return Variant(cuda=self.cuda, python=self.python or host_python, torch=self.torch)


@dataclass(frozen=True)
class ReleaseRule:
    arch: tuple[Arch, ...] | None
    cuda: tuple[Version, ...] | None
    torch: tuple[Version, ...] | None
    python: tuple[str, ...] | None

    def matches(self, arch: Arch, variant: Variant) -> bool:
        def short(v: Version) -> tuple[int, ...]:
            return v.release[:2]

        return ((self.arch is None or any(a.base == arch.base for a in self.arch))
                and (self.cuda is None or any(short(c) == short(variant.cuda) for c in self.cuda))
                and (self.torch is None or (variant.torch is not None
                                            and any(_torch_match(t, variant.torch) for t in self.torch)))
                and (self.python is None or variant.python in self.python))


def _torch_match(rule: Version, have: Version) -> bool:
    n = min(len(rule.release), 3)
    return have.release[:n] == rule.release[:n]


@dataclass(frozen=True)
class Release:
    archs: tuple[Arch, ...]  # in the project's declared spelling
    variants: tuple[ReleaseVariant, ...]
    exclude: tuple[ReleaseRule, ...] = ()


@dataclass(frozen=True, order=True)
class ReleaseBuild:
    arch: Arch
    variant: Variant


def read_release(t: ReleaseTable, key: str, *, project_archs: Sequence[Arch], torch_abi: bool,
                 error: Callable[[str, str], ConfigError]) -> Release:
    """Check a release table against its project. ``error(key, problem)`` makes the ConfigError."""
    if not t.archs:
        raise error(f"{key}.archs", "is empty: list the archs a release builds, e.g. [\"sm_90a\"]")
    if not t.variants:
        raise error(f"{key}.variants", "is empty: list at least one { cuda = \"13.0\" }")
    archs = []
    for i, text in enumerate(t.archs):
        arch = _arch(text, f"{key}.archs[{i}]", error)
        declared = next((a for a in project_archs if a.base == arch.base), None)
        if declared is None:
            raise error(f"{key}.archs[{i}]", f"is {arch.sm}, which is not in the project's archs")
        archs.append(declared)
    variants = []
    for i, v in enumerate(t.variants):
        where = f"{key}.variants[{i}]"
        if torch_abi and v.torch is None:
            raise error(f"{where}.torch", "is missing: this project builds against torch (torch_abi = true)")
        if not torch_abi and v.torch is not None:
            raise error(f"{where}.torch", "is set, and the project is torch-free (torch_abi = false): drop it")
        variants.append(ReleaseVariant(
            cuda=_version(v.cuda, f"{where}.cuda", "CUDA", error),
            torch=_version(v.torch, f"{where}.torch", "torch", error) if v.torch else None,
            python=_python(v.python, f"{where}.python", error) if v.python else None))
    rules = []
    for i, r in enumerate(t.exclude):
        where = f"{key}.exclude[{i}]"
        if r == ReleaseRuleTable():
            raise error(where, "is empty: it would exclude every build (give arch, cuda, torch and/or python)")
        rules.append(ReleaseRule(
            arch=tuple(_arch(a, f"{where}.arch", error) for a in r.arch) if r.arch is not None else None,
            cuda=tuple(_version(c, f"{where}.cuda", "CUDA", error) for c in r.cuda) if r.cuda is not None else None,
            torch=tuple(_version(c, f"{where}.torch", "torch", error) for c in r.torch) if r.torch is not None else None,
            python=tuple(_python(p, f"{where}.python", error) for p in r.python) if r.python is not None else None))
    return Release(archs=tuple(archs), variants=tuple(variants), exclude=tuple(rules))


def expand(release: Release, host_python: str) -> tuple[ReleaseBuild, ...]:
    """Every (arch, variant) of the matrix, less the excludes, in declared order (duplicates once)."""
    out: list[ReleaseBuild] = []
    for arch in release.archs:
        for rv in release.variants:
            build = ReleaseBuild(arch, rv.resolve(host_python))
            if build not in out and not any(rule.matches(arch, build.variant) for rule in release.exclude):
                out.append(build)
    return tuple(out)


def _arch(text: str, key: str, error: Callable[[str, str], ConfigError]) -> Arch:
    try:
        return parse_arch(text)
    except ArchError as exc:
        raise error(key, f"is not a known CUDA arch: {exc.what}") from None


def _version(text: str, key: str, what: str, error: Callable[[str, str], ConfigError]) -> Version:
    try:
        return parse_version(text, key, what)
    except ConfigError as exc:
        raise error(key, exc.what) from None


def _python(text: str, key: str, error: Callable[[str, str], ConfigError]) -> str:
    try:
        return parse_python(text, key)
    except ConfigError as exc:
        raise error(key, exc.what) from None
