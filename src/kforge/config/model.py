"""The forge.toml model: what the file declares, as frozen dataclasses (read by :mod:`kforge.config.forge`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from packaging.version import Version

from kforge.config.releasematrix import Release
from kforge.config.schema import ArchNumber, EnvValue
from kforge.config.source import GitSource, LocalSource, SdistSource, Source
from kforge.cuda.arch import Arch
from kforge.errors import ConfigError, did_you_mean

VARIANT_RULES = ("declared", "flashinfer")
RELEASE_SET = "release"  # the arch set whose wheels carry no arch label (docs/forge-toml.md, "Targets and wheel names")
ARCH_ENFORCE_MODES = ("on", "check", "off")  # kforge.cuda.nvccwrap.MODES
#: A project's PTX policy (``ptx``): what upstream's own build ships (``upstream_ptx``), or one of UPSTREAM_PTX.
PTX_POLICIES = ("upstream", "highest", "none", "all")
#: What an upstream's own build ships (``upstream_ptx``): no PTX, PTX of the highest arch only, PTX of every arch.
UPSTREAM_PTX = ("none", "highest", "all")
#: The build backends by name; kforge.backends.BACKENDS maps each to its module (a test keeps the two equal).
BACKEND_NAMES = ("native", "cibuildwheel", "cmake")


@dataclass(frozen=True)
class Toolchains:
    cuda: tuple[Version, ...]
    torch: tuple[Version, ...]
    python: tuple[str, ...]


@dataclass(frozen=True)
class Platform:
    """``[platforms.NAME]``: its keys are the fields after ``name``."""

    name: str  # linux-x86_64 (the table's name)
    os: str  # linux | windows
    alias: str = ""  # linux
    machine: str = ""
    env: Mapping[str, EnvValue] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def suffix_names(self) -> tuple[str, ...]:
        return (self.name, self.alias) if self.alias else (self.name,)


@dataclass(frozen=True)
class ArchKnob:
    """How a project reads its arch list: one environment variable (or a family of flags)."""

    format: str  # a key of kforge.cuda.render.RENDERERS
    env: str | None = None  # the variable that receives the rendered list
    prefix: str | None = None  # disable-flags: FLASH_MLA_DISABLE_
    value: EnvValue = EnvValue("1")  # disable-flags: the value written for a disabled family
    families: Mapping[str, tuple[ArchNumber, ...]] = field(default_factory=lambda: MappingProxyType({}))
    only: tuple[ArchNumber, ...] | None = None  # render only archs whose number (major*10+minor) is listed


@dataclass(frozen=True)
class Profile:
    """``[projects.NAME.profiles.PROFILE]``: its keys are the fields after ``name``."""

    name: str
    description: str = ""
    env: Mapping[str, EnvValue] = field(default_factory=lambda: MappingProxyType({}))
    compile_units: int | None = None  # this profile's unit count (the project's compile_units otherwise)


@dataclass(frozen=True)
class UnitGroup:
    """Units of one kind that compile in the same parts (one entry of ``unit_split.groups``)."""

    units: str  # glob over a unit's output file name
    parts: tuple[tuple[str, float], ...]  # (suffix before ".o", share of the whole unit's time)
    exclude: str = ""  # glob of units that stay whole

    def _named(self, key: str) -> bool:
        name = key.rsplit("/", 1)[-1]
        return fnmatch.fnmatchcase(name, self.units) and not (self.exclude and fnmatch.fnmatchcase(name, self.exclude))

    def part_keys(self, key: str) -> tuple[str, ...]:
        stem = key[:-2] if key.endswith(".o") else key
        return tuple(f"{stem}{suffix}.o" for suffix, _ in self.parts)

    def base_of(self, key: str) -> str | None:
        """The whole unit's key when ``key`` is one of its parts, else None."""
        for suffix, _ in self.parts:
            if key.endswith(f"{suffix}.o") and self._named(base := key[: -len(f"{suffix}.o")] + ".o"):
                return base
        return None

    def matches(self, key: str) -> bool:
        return self._named(key) and self.base_of(key) is None

    @property
    def total_share(self) -> float:
        return sum(share for _, share in self.parts)


@dataclass(frozen=True)
class UnitSplit:
    """forge.toml's ``unit_split``: long units the project's patches can compile in parts (:mod:`kforge.build.unitsplit`)."""

    env: str  # the variable the project's patch reads: "1" cut, "0" whole
    groups: tuple[UnitGroup, ...]
    note: str = ""  # where the shares come from

    def group_of(self, key: str) -> UnitGroup | None:
        """The group a whole unit is cut by, or None."""
        return next((g for g in self.groups if g.matches(key)), None)

    def part_of(self, key: str) -> tuple[str, UnitGroup] | None:
        """(the whole unit's key, its group) when ``key`` is a part, else None."""
        for g in self.groups:
            if (base := g.base_of(key)) is not None:
                return base, g
        return None


@dataclass(frozen=True)
class GpuTests:
    paths: tuple[str, ...]  # relative to the project's source tree
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class CiRunners:
    """Where CI builds one platform's targets (``[ci.runners.<platform>]``)."""

    hosted: str  # a GitHub-hosted runner label: builds that need no torch (fmha)
    self_hosted: tuple[str, ...]  # labels of self-hosted build runners: torch-ABI builds
    hosted_cuda: str  # how CUDA reaches a hosted runner: "pypi" (kforge provisions nvcc) | "action" (a pinned toolkit action)


DEFAULT_CI_RUNNERS = {
    "linux-x86_64": CiRunners("ubuntu-24.04", ("self-hosted", "linux", "x64", "build"), "pypi"),
    "linux-aarch64": CiRunners("ubuntu-24.04-arm", ("self-hosted", "linux", "arm64", "build"), "pypi"),
    "windows-amd64": CiRunners("windows-2022", ("self-hosted", "windows", "x64", "build"), "action"),
}
CI_PUBLISH = ("pages", "release")
CI_CUDA = ("pypi", "action")
CI_RUNNER_KINDS = ("hosted", "self-hosted")  # a project's ci_runner


@dataclass(frozen=True)
class CiSettings:
    """``[ci]``: what ``kforge ci generate`` writes into the GitHub Actions workflows."""

    python: str = "3.12"  # the interpreter build jobs set up
    publish: str = "pages"  # "pages" (a GitHub Pages site) | "release" (assets of the tag's release)
    gpu_labels: tuple[str, ...] = ("self-hosted", "linux", "x64", "gpu")  # + "sm<NN>" of the target's arch
    gpu_python: str = "python3"  # the GPU runner's interpreter (it has the torch the tests use)
    build_timeout: int = 360  # minutes
    test_timeout: int = 60
    torch_index: str = "https://download.pytorch.org/whl/cu{cuda_nodot}"  # where torch of a CUDA variant comes from
    runners: Mapping[str, CiRunners] = field(default_factory=lambda: MappingProxyType(dict(DEFAULT_CI_RUNNERS)))


@dataclass(frozen=True)
class Project:
    name: str
    description: str
    source: Source  # the one builds use
    git: GitSource | None
    sdist: SdistSource | None
    local: LocalSource | None
    upstream_version: str | None
    build_dir: str  # inside the source tree
    archs: tuple[Arch, ...]
    default_arch: Arch
    platforms: tuple[str, ...]
    backend: str
    torch_abi: bool
    build_isolation: bool
    min_cuda: Version | None
    variant_rule: str
    arch_knobs: tuple[ArchKnob, ...]
    env: Mapping[str, str]
    local_version_env: str | None
    threads_env: str  # the project's name for nvcc --threads (NVCC_THREADS, FLASHINFER_NVCC_THREADS)
    patches: Path | None  # absolute directory holding `series`
    gpu_tests: GpuTests | None
    compile_units: int | None
    profiles: Mapping[str, Profile]
    repair_exclude: tuple[str, ...]
    # PEP 440 specifier: the upstream versions the knobs above (env, arch_knobs, threads_env,
    # local_version_env, variant_rule) were checked against (`kforge audit`); plan refuses others.
    knobs_valid_for: str | None = None
    platform_tag: str | None = None  # the oldest manylinux tag its Linux wheels must reach (repair enforces it)
    build_requires: tuple[str, ...] = ()  # what a provisioned variant environment gets besides torch
    release: Release | None = None  # the release matrix (kforge release): archs x variants, less excludes
    #: archs (base spelling, ``sm_120``) that plan but cannot build yet, with the reason: CI leaves them out
    unbuildable: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    arch_enforce: str = "on"  # on | check | off: kforge's nvcc wrapper enforces the plan's archs (kforge.cuda.enforce)
    ci_runner: str = "hosted"  # hosted | self-hosted: where CI builds it (forge.toml's default: self-hosted for torch ABI)
    ptx: str = "upstream"  # PTX_POLICIES: which archs get PTX besides SASS (kforge.config.binarypolicy)
    upstream_ptx: str | None = None  # UPSTREAM_PTX: what upstream's own build ships, read from its build scripts
    strip_debug: bool = True  # strip host debug info (.debug_*) from the wheel's own ELF binaries before repair
    ptxas_threads: int = 1  # > 1: ptxas --split-compile N in every device step (kforge.cuda.nvccwrap; same SASS)
    unit_split: UnitSplit | None = None  # long units its patches can compile in parts (kforge.build.unitsplit)

    @property
    def default_profile(self) -> str | None:
        """The build profile a build without ``--profile`` uses: ``full`` when declared, else the first (or none)."""
        if not self.profiles:
            return None
        return "full" if "full" in self.profiles else next(iter(self.profiles))

    def units(self, profile: str | None) -> int | None:
        """Compile units of a build with ``profile``: the profile's own count, else the project's."""
        own = self.profiles[profile].compile_units if profile is not None and profile in self.profiles else None
        return own or self.compile_units

    def unbuildable_reason(self, arch: Arch) -> str | None:
        return self.unbuildable.get(arch.base.sm)
    arch_sets: Mapping[str, tuple[Arch, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Named sets of declared archs, usable as a target (``flash-attn-release``); ``release`` is the default set."""

    @property
    def release_set(self) -> tuple[Arch, ...] | None:
        """The project's default release set (``arch_sets.release``): its wheels carry no arch label."""
        return self.arch_sets.get(RELEASE_SET)


@dataclass(frozen=True)
class MatrixRule:
    project: tuple[str, ...] | None = None
    arch: tuple[Arch, ...] | None = None
    platform: tuple[str, ...] | None = None

    def matches(self, project: str, arch: Arch, platform: str) -> bool:
        if self.project is not None and project not in self.project:
            return False
        if self.arch is not None and not any(a.base == arch.base for a in self.arch):
            return False
        return self.platform is None or platform in self.platform


@dataclass(frozen=True)
class Forge:
    root: Path
    path: Path
    toolchains: Toolchains
    platforms: Mapping[str, Platform]
    projects: Mapping[str, Project]
    exclude: tuple[MatrixRule, ...]
    include: tuple[MatrixRule, ...]
    ci: CiSettings = CiSettings()

    def project(self, name: str) -> Project:
        try:
            return self.projects[name]
        except KeyError:
            raise ConfigError(
                f"unknown project '{name}'{did_you_mean(name, self.projects)}",
                why=f"{self.path.name} declares: {', '.join(self.projects)}",
                fix="check the spelling, or add a [projects.NAME] table to forge.toml",
            ) from None

    def platform(self, name: str) -> Platform:
        for plat in self.platforms.values():
            if name in plat.suffix_names:
                return plat
        names = [n for p in self.platforms.values() for n in p.suffix_names]
        raise ConfigError(
            f"unknown platform '{name}'{did_you_mean(name, names)}",
            why=f"forge.toml declares: {', '.join(names)}",
            fix="use one of those, or add a [platforms.NAME] table",
        )


# ---------------------------------------------------------------------------------------------
