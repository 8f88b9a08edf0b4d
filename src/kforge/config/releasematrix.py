"""A project's release matrix: archs x variants, less excludes, as forge.toml declares it (``[projects.X.release]``).

The ``*Table`` dataclasses are the file's shape (kforge.config.schema reads them); :func:`read_release` checks the
domain (archs the project has, or names of its ``arch_sets``; versions that parse; no torch for a torch-free
project) and gives the frozen :class:`Release`. :func:`expand` turns it into the builds, one (archs, variant)
each, with the host's Python filling in a variant that names none. An entry of ``archs`` is one arch (one
wheel per variant for that arch) or the name of an arch set (one fat wheel per variant with all of the set's
archs, the same build as the target ``<project>-<set>``). :func:`select` keeps the builds that ``--only``
selectors name (``sm_90``, ``cu130-torch2.11-cp312``, ``sm_90/cu130-torch2.11-cp312``, ``release/cu130-cp312``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from packaging.version import Version

from kforge.config.variant import Variant, parse_python, parse_variant_id, parse_version
from kforge.cuda.arch import Arch, parse_arch
from kforge.errors import ArchError, ConfigError, did_you_mean


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


@dataclass(frozen=True, order=True)
class ReleaseArchs:
    """One entry of a release matrix's ``archs``: one arch (a per-arch wheel), or an arch set (one fat wheel)."""

    archs: tuple[Arch, ...]  # the project's declared spellings; an arch set's in arch order
    arch_set: str | None = None  # the arch set's name, when the entry named one

    @property
    def name(self) -> str:
        """How selectors and messages spell it: ``sm_90`` or the set's name (``release``)."""
        return self.arch_set or self.archs[0].sm

    def named_by(self, arch: Arch) -> bool:
        """Does ``arch`` (from an exclude rule) concern this entry: it is the arch, or one of the set's?"""
        return any(a.base == arch.base for a in self.archs)


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
    arch_set: tuple[str, ...] = ()  # arch set names the rule's ``arch`` listed

    def matches(self, archs: ReleaseArchs, variant: Variant) -> bool:
        """Every key given matches. An arch key matches an arch set's build when it names the set or one of its
        archs (the fat wheel holds that arch, so the pair is left out)."""
        def short(v: Version) -> tuple[int, ...]:
            return v.release[:2]

        arch_ok = self.arch is None or (archs.arch_set is not None and archs.arch_set in self.arch_set) or any(
            archs.named_by(a) for a in self.arch)
        return (arch_ok
                and (self.cuda is None or any(short(c) == short(variant.cuda) for c in self.cuda))
                and (self.torch is None or (variant.torch is not None
                                            and any(_torch_match(t, variant.torch) for t in self.torch)))
                and (self.python is None or variant.python in self.python))


def _torch_match(rule: Version, have: Version) -> bool:
    n = min(len(rule.release), 3)
    return have.release[:n] == rule.release[:n]


@dataclass(frozen=True)
class Release:
    archs: tuple[ReleaseArchs, ...]  # in declared order
    variants: tuple[ReleaseVariant, ...]
    exclude: tuple[ReleaseRule, ...] = ()


@dataclass(frozen=True, order=True)
class ReleaseBuild:
    entry: ReleaseArchs
    variant: Variant

    @property
    def archs(self) -> tuple[Arch, ...]:
        return self.entry.archs

    @property
    def key(self) -> str:
        """``sm_90/cu130-torch2.11-cp312`` (an arch set: ``release/cu130-cp312``): what ``--only`` names."""
        return f"{self.entry.name}/{self.variant.id}"


def read_release(t: ReleaseTable, key: str, *, project_archs: Sequence[Arch], torch_abi: bool,
                 error: Callable[[str, str], ConfigError],
                 arch_sets: Mapping[str, tuple[Arch, ...]] | None = None) -> Release:
    """Check a release table against its project. ``error(key, problem)`` makes the ConfigError."""
    sets = arch_sets or {}
    if not t.archs:
        raise error(f"{key}.archs", "is empty: list the archs a release builds, e.g. [\"sm_90a\"], or an arch set's name")
    if not t.variants:
        raise error(f"{key}.variants", "is empty: list at least one { cuda = \"13.0\" }")
    archs: list[ReleaseArchs] = []
    for i, text in enumerate(t.archs):
        if text in sets:
            entry = ReleaseArchs(tuple(sets[text]), text)
        else:
            arch = _arch(text, f"{key}.archs[{i}]", error, sets, names=True)
            declared = next((a for a in project_archs if a.base == arch.base), None)
            if declared is None:
                raise error(f"{key}.archs[{i}]", f"is {arch.sm}, which is not in the project's archs")
            entry = ReleaseArchs((declared,))
        if entry in archs:
            raise error(f"{key}.archs[{i}]", f"lists {entry.name} twice")
        archs.append(entry)
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
            arch=tuple(_arch(a, f"{where}.arch", error, sets) for a in r.arch if a not in sets)
            if r.arch is not None else None,
            arch_set=tuple(a for a in r.arch or () if a in sets),
            cuda=tuple(_version(c, f"{where}.cuda", "CUDA", error) for c in r.cuda) if r.cuda is not None else None,
            torch=tuple(_version(c, f"{where}.torch", "torch", error) for c in r.torch) if r.torch is not None else None,
            python=tuple(_python(p, f"{where}.python", error) for p in r.python) if r.python is not None else None))
    return Release(archs=tuple(archs), variants=tuple(variants), exclude=tuple(rules))


def expand(release: Release, host_python: str) -> tuple[ReleaseBuild, ...]:
    """Every (archs, variant) of the matrix, less the excludes, in declared order (duplicates once)."""
    out: list[ReleaseBuild] = []
    for entry in release.archs:
        for rv in release.variants:
            build = ReleaseBuild(entry, rv.resolve(host_python))
            if build not in out and not any(rule.matches(entry, build.variant) for rule in release.exclude):
                out.append(build)
    return tuple(out)


@dataclass(frozen=True)
class Selector:
    """One ``--only``: an arch (or arch set name), a variant id, or both (``sm_90/cu130-torch2.11-cp312``)."""

    text: str
    arch: Arch | None = None
    arch_set: str | None = None
    variant: str | None = None  # a variant id

    def matches(self, build: ReleaseBuild) -> bool:
        entry = build.entry
        if self.arch_set is not None and entry.arch_set != self.arch_set:
            return False
        if self.arch is not None and (entry.arch_set is not None or entry.archs[0].base != self.arch.base):
            return False
        return self.variant is None or build.variant.id == self.variant


def parse_selector(text: str, arch_sets: Sequence[str] = ()) -> Selector:
    """``ARCH``, ``VARIANT-ID`` or ``ARCH/VARIANT-ID`` (ARCH may be an arch set's name); a ConfigError otherwise."""
    raw = text.strip()
    arch_part, slash, variant_part = raw.partition("/")
    if not slash and _looks_like_variant(raw):
        arch_part, variant_part = "", raw
    if slash and not (arch_part and variant_part):
        raise _bad_selector(text, "one side of '/' is empty")
    variant = None
    if variant_part:
        try:
            variant = parse_variant_id(variant_part).id
        except ConfigError as exc:
            raise _bad_selector(text, exc.what) from None
        if variant != variant_part.strip():  # only one spelling: the one `kforge release --dry-run` prints
            raise _bad_selector(text, f"write the variant as {variant}")
    if not arch_part:
        return Selector(raw, variant=variant)
    if arch_part in arch_sets:
        return Selector(raw, arch_set=arch_part, variant=variant)
    try:
        return Selector(raw, arch=parse_arch(arch_part), variant=variant)
    except ArchError as exc:
        sets = f" or one of the arch sets {', '.join(arch_sets)}" if arch_sets else ""
        raise _bad_selector(text, f"'{arch_part}' is not a CUDA arch{sets} ({exc.what})") from None


def _looks_like_variant(text: str) -> bool:
    return text.lower().startswith("cu") and "-" in text


def _bad_selector(text: str, why: str) -> ConfigError:
    return ConfigError(f"--only {text!r} is not a build selector", why=why,
                       fix="write --only ARCH, --only VARIANT-ID or --only ARCH/VARIANT-ID, e.g. "
                           "--only sm_90/cu130-torch2.11-cp312 (`kforge release <project> --dry-run` lists them)")


def select(builds: Sequence[ReleaseBuild], selectors: Sequence[Selector], project: str) -> tuple[ReleaseBuild, ...]:
    """The builds any selector names, in matrix order; every selector must name at least one build."""
    if not selectors:
        return tuple(builds)
    for sel in selectors:
        if not any(sel.matches(b) for b in builds):
            names = sorted({b.entry.name for b in builds}, key=lambda n: [b.entry.name for b in builds].index(n))
            variants = sorted({b.variant.id for b in builds}, key=lambda v: [b.variant.id for b in builds].index(v))
            raise ConfigError(
                f"--only {sel.text} matches no build of the release matrix of {project}",
                why=f"its archs are {', '.join(names)}; its variants are {', '.join(variants)}; its builds are "
                    + ", ".join(b.key for b in builds),
                fix=f"pick from those, e.g. --only {builds[0].key} (`kforge release {project} --dry-run` lists them)")
    return tuple(b for b in builds if any(sel.matches(b) for sel in selectors))


def _arch(text: str, key: str, error: Callable[[str, str], ConfigError],
          sets: Mapping[str, object] | None = None, *, names: bool = False) -> Arch:
    """An arch; ``names``: the place also takes an arch set's name, so the error says which sets exist."""
    try:
        return parse_arch(text)
    except ArchError as exc:
        if not names and not sets:
            raise error(key, f"is not a known CUDA arch: {exc.what}") from None
        project_key = key.split(".release", 1)[0]
        if sets:
            hint = did_you_mean(text, list(sets))
            raise error(key, f"is '{text}', neither a CUDA arch nor one of the project's arch sets "
                             f"({', '.join(sets)}){hint}: {exc.what}") from None
        raise error(key, f"is '{text}', neither a CUDA arch nor an arch set: {project_key} declares no arch_sets "
                         f"(add arch_sets = {{ {text} = [\"sm_80\", \"sm_90\"] }} to [{project_key}] for one fat "
                         f"wheel of several archs): {exc.what}") from None


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
