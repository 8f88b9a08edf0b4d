"""Load and validate ``forge.toml`` into frozen dataclasses (the file's schema is the ``*Table`` dataclasses).

Every mistake is a :class:`~kforge.errors.ConfigError` that names the key path
(``projects.flashmla.archs[2]``), what was wrong, and a "did you mean" where one fits.
Keys and types are checked by :mod:`kforge.config.schema` from the ``*Table`` dataclasses' fields; only the
domain checks (commit hashes, arch names, cross-references) are written here.
Nothing here touches the environment: :func:`load_forge` reads one file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kforge.config.archs import read_arch, read_arch_sets, read_archs
from kforge.config.model import (
    ARCH_ENFORCE_MODES,
    BACKEND_NAMES,
    CI_CUDA,
    CI_PUBLISH,
    CI_RUNNER_KINDS,
    DEFAULT_CI_RUNNERS,
    PTX_POLICIES,
    UPSTREAM_PTX,
    VARIANT_RULES,
    ArchKnob,
    CiRunners,
    CiSettings,
    Forge,
    GpuTests,
    MatrixRule,
    Platform,
    Profile,
    Project,
    Toolchains,
    UnitGroup,
    UnitSplit,
)
from kforge.config.releasematrix import ReleaseTable, read_release
from kforge.config.schema import EnvValue, Reader, normalise_env_value
from kforge.config.source import GitSource, LocalSource, SdistSource, Source
from kforge.cuda.arch import Arch
from kforge.cuda.render import RENDERERS
from kforge.errors import ConfigError, decode_utf8, did_you_mean

__all__ = ["FORGE_FILE", "find_root", "load_forge", "normalise_env_value", "parse_forge"]  # the model: kforge.config.model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FORGE_FILE = "forge.toml"
MAX_PTXAS_THREADS = 64  # a project's ptxas_threads (ptxas --split-compile N) at most
_MANYLINUX_TAG = re.compile(r"^manylinux_[0-9]+_[0-9]+$")
def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) that holds forge.toml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / FORGE_FILE).is_file():
            return candidate
    raise ConfigError(
        f"no {FORGE_FILE} found in {here} or any parent directory",
        why="kforge reads the monorepo's forge.toml to know what it can build",
        fix="run kforge inside the kforge checkout, or pass -C/--root PATH",
    )


def load_forge(root: Path | str | None = None, *, path: Path | None = None) -> Forge:
    """Read ``forge.toml`` under ``root`` (or the file at ``path``) into a validated :class:`Forge`."""
    if path is None:
        root_path = Path(root).resolve() if root is not None else find_root()
        path = root_path / FORGE_FILE
        if not path.is_file():
            raise ConfigError(
                f"{path} does not exist", fix="run kforge inside the kforge checkout, or pass -C/--root PATH"
            )
    else:
        path = Path(path).resolve()
        root_path = Path(root).resolve() if root is not None else path.parent
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", fix="check the path and its permissions") from None
    text = decode_utf8(raw, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path.name} is not valid TOML: {exc}",
            fix=f"fix the syntax at that line of {path}",
        ) from None
    return parse_forge(data, root=root_path, path=path)


# ---------------------------------------------------------------------------------------------
# The file's shape: one dataclass per kind of table, key for key (kforge.config.schema checks keys and types).

def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ToolchainsTable:
    cuda: tuple[str, ...] = ("13.0",)
    torch: tuple[str, ...] = ()
    python: tuple[str, ...] = ("3.11",)


@dataclass(frozen=True)
class SourceTable:
    use: str | None = None  # git | sdist | local (default: the first declared)
    git: GitSource | None = None
    sdist: SdistSource | None = None
    local: str | None = None


@dataclass(frozen=True)
class UnitGroupTable:
    units: str
    parts: Mapping[str, float]
    exclude: str = ""


@dataclass(frozen=True)
class UnitSplitTable:
    env: str
    groups: tuple[UnitGroupTable, ...]
    note: str = ""


@dataclass(frozen=True)
class ProjectTable:
    source: SourceTable
    archs: tuple[str, ...]
    description: str = ""
    upstream_version: str | None = None
    build_dir: str = "."
    default_arch: str | None = None
    platforms: tuple[str, ...] | None = None  # default: every declared platform
    backend: str = "native"
    torch_abi: bool = False
    build_isolation: bool = True
    min_cuda: str | None = None
    variant_rule: str = "declared"
    arch_knobs: tuple[ArchKnob, ...] = ()
    env: Mapping[str, EnvValue] = field(default_factory=_empty)
    local_version_env: str | None = None
    threads_env: str = "NVCC_THREADS"
    patches: str | None = None
    gpu_tests: GpuTests | None = None
    compile_units: int | None = None
    profiles: Mapping[str, dict] = field(default_factory=_empty)  # each read as a Profile
    repair_exclude: tuple[str, ...] = ()
    knobs_valid_for: str | None = None
    platform_tag: str | None = None  # the oldest manylinux tag the project's Linux wheels must reach
    build_requires: tuple[str, ...] = ()  # packages a provisioned variant environment gets besides torch
    release: ReleaseTable | None = None  # the release matrix: archs x variants, less excludes
    unbuildable: Mapping[str, str] = field(default_factory=_empty)  # arch -> why it can't build yet
    arch_sets: Mapping[str, tuple[str, ...]] = field(default_factory=_empty)  # each a set of declared archs
    arch_enforce: str = "on"  # on | check | off (kforge.cuda.enforce)
    ci_runner: str | None = None  # hosted | self-hosted (default: self-hosted for a torch-ABI project)
    ptx: str = "upstream"  # upstream | highest | none | all (kforge.config.binarypolicy)
    upstream_ptx: str | None = None  # none | highest | all: what upstream's own build ships
    strip_debug: bool = True  # strip host debug info from the wheel's own ELF binaries
    ptxas_threads: int = 1  # ptxas --split-compile N in every device step (kforge's nvcc wrapper)
    unit_split: UnitSplitTable | None = None  # long units its patches can compile in parts (kforge.build.unitsplit)


@dataclass(frozen=True)
class RuleTable:
    project: tuple[str, ...] | None = None
    arch: tuple[str, ...] | None = None
    platform: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MatrixTable:
    exclude: tuple[RuleTable, ...] = ()
    include: tuple[RuleTable, ...] = ()


@dataclass(frozen=True)
class CiRunnersTable:
    """``[ci.runners.PLATFORM]``: a key left out keeps the platform's default."""

    hosted: str | None = None
    self_hosted: tuple[str, ...] | None = None
    hosted_cuda: str | None = None


@dataclass(frozen=True)
class CiTable:
    python: str = CiSettings.python
    publish: str = CiSettings.publish
    gpu_labels: tuple[str, ...] = CiSettings.gpu_labels
    gpu_python: str = CiSettings.gpu_python
    build_timeout: int = CiSettings.build_timeout
    test_timeout: int = CiSettings.test_timeout
    torch_index: str = CiSettings.torch_index
    runners: Mapping[str, CiRunnersTable] = field(default_factory=_empty)


@dataclass(frozen=True)
class ForgeTable:
    platforms: Mapping[str, dict]  # each read as a Platform
    projects: Mapping[str, dict]  # each read as a ProjectTable
    toolchains: ToolchainsTable = field(default_factory=ToolchainsTable)
    matrix: MatrixTable = field(default_factory=MatrixTable)
    ci: CiTable = field(default_factory=lambda: CiTable())


# ---------------------------------------------------------------------------------------------
# Domain checks and conversion to the runtime dataclasses


def parse_forge(data: dict[str, Any], *, root: Path, path: Path) -> Forge:
    r = Reader(path)
    top: ForgeTable = r.table(ForgeTable, data, "")
    toolchains = _toolchains(r, top.toolchains)
    platforms = {name: Platform(name=name, **r.values(Platform, t, f"platforms.{name}", skip=("name",)))
                 for name, t in top.platforms.items()}
    _check_platforms(r, platforms)
    if not top.projects:
        raise r.error("projects", "is empty", fix="declare at least one [projects.NAME] table")
    projects = {name: _project(r, name, table, platforms, root) for name, table in top.projects.items()}
    return Forge(
        root=root,
        path=path,
        toolchains=toolchains,
        platforms=MappingProxyType(platforms),
        projects=MappingProxyType(projects),
        exclude=tuple(_rule(r, f"matrix.exclude[{i}]", t, projects, platforms) for i, t in enumerate(top.matrix.exclude)),
        include=tuple(_rule(r, f"matrix.include[{i}]", t, projects, platforms) for i, t in enumerate(top.matrix.include)),
        ci=_ci(r, top.ci, platforms),
    )


def _ci(r: Reader, t: CiTable, platforms: Mapping[str, Platform]) -> CiSettings:
    _one_of(r, "ci.publish", t.publish, CI_PUBLISH)
    for name in ("build_timeout", "test_timeout"):
        if getattr(t, name) < 1:
            raise r.error(f"ci.{name}", "must be a positive number of minutes")
    if not t.gpu_labels or not all(t.gpu_labels):
        raise r.error("ci.gpu_labels", "must list runner labels, none of them empty", fix=f"e.g. gpu_labels = {list(CiSettings.gpu_labels)!r}")
    runners = dict(DEFAULT_CI_RUNNERS)
    for name, rt in t.runners.items():
        key = f"ci.runners.{name}"
        _one_of(r, key, name, tuple(platforms), "is not a declared platform")
        old = runners.get(name) or CiRunners("ubuntu-24.04", ("self-hosted", "build"), "pypi")
        if rt.hosted_cuda is not None:
            _one_of(r, f"{key}.hosted_cuda", rt.hosted_cuda, CI_CUDA)
        if rt.self_hosted is not None and (not rt.self_hosted or not all(rt.self_hosted)):
            raise r.error(f"{key}.self_hosted", "must list runner labels, none of them empty")
        runners[name] = CiRunners(hosted=rt.hosted or old.hosted, self_hosted=rt.self_hosted or old.self_hosted,
                                  hosted_cuda=rt.hosted_cuda or old.hosted_cuda)
    return CiSettings(python=t.python, publish=t.publish, gpu_labels=t.gpu_labels, gpu_python=t.gpu_python,
                      build_timeout=t.build_timeout, test_timeout=t.test_timeout, torch_index=t.torch_index,
                      runners=MappingProxyType(runners))


def _unbuildable(r: Reader, key: str, t: ProjectTable, archs: tuple[Arch, ...]) -> Mapping[str, str]:
    out: dict[str, str] = {}
    for text, reason in t.unbuildable.items():
        arch = read_arch(r, f"{key}.unbuildable.{text}", text)
        if not any(a.base == arch.base for a in archs):
            raise r.error(f"{key}.unbuildable.{text}", f"names {arch.sm}, which is not in archs")
        if not reason.strip():
            raise r.error(f"{key}.unbuildable.{text}", "must be the reason, as a non-empty string")
        out[arch.base.sm] = normalise_env_value(reason)
    return MappingProxyType(out)


def _version(r: Reader, key: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise r.error(key, f"is not a version: {text!r}", fix="write it as MAJOR.MINOR, e.g. \"12.8\"") from None


def _toolchains(r: Reader, t: ToolchainsTable) -> Toolchains:
    if not t.cuda or not t.python:
        raise r.error("toolchains.cuda" if not t.cuda else "toolchains.python", "is empty",
                      fix="list at least one version, e.g. cuda = [\"13.0\"], python = [\"3.11\"]")
    return Toolchains(cuda=tuple(_version(r, "toolchains.cuda", v) for v in t.cuda),
                      torch=tuple(_version(r, "toolchains.torch", v) for v in t.torch), python=t.python)


def _check_platforms(r: Reader, platforms: Mapping[str, Platform]) -> None:
    seen: dict[str, str] = {}
    for plat in platforms.values():
        if plat.os not in ("linux", "windows"):
            raise r.error(f"platforms.{plat.name}.os", f"must be 'linux' or 'windows', not {plat.os!r}")
        for n in plat.suffix_names:
            if n in seen and seen[n] != plat.name:
                raise r.error(f"platforms.{plat.name}.alias", f"'{n}' is already used by platforms.{seen[n]}")
            seen[n] = plat.name


def _one_of(r: Reader, key: str, value: str, allowed: Sequence[str], what: str = "") -> None:
    if value not in allowed:
        raise r.error(key, f"{what or 'must be one of ' + ', '.join(allowed)}{did_you_mean(value, allowed)}",
                      fix=f"use one of: {', '.join(allowed)}")


def _project(r: Reader, name: str, data: Mapping[str, Any], platforms: Mapping[str, Platform], root: Path) -> Project:
    key = f"projects.{name}"
    if not name or not name.isascii() or not all(c.isalnum() or c in "-_" for c in name) or name != name.lower():
        raise r.error(key, "is not a valid project name", fix="use lower-case ASCII letters, digits, '-'")
    if not isinstance(data, dict) or "source" not in data:  # say how to write one, not just "is missing"
        r.values(ProjectTable, data, key, skip=("source", "archs"))
        raise r.error(f"{key}.source", "is missing",
                      fix="add source = { git = {...} } or { sdist = {...} } or { local = \"kernels/NAME\" }")
    t: ProjectTable = r.table(ProjectTable, data, key)
    archs, default_arch = read_archs(r, key, t.archs, t.default_arch)
    for i, p in enumerate(t.platforms or ()):
        _one_of(r, f"{key}.platforms[{i}]", p, tuple(platforms), f"'{p}' is not a declared platform")
    _one_of(r, f"{key}.backend", t.backend, BACKEND_NAMES, f"'{t.backend}' is not a backend")
    _one_of(r, f"{key}.variant_rule", t.variant_rule, VARIANT_RULES)
    _one_of(r, f"{key}.arch_enforce", t.arch_enforce, ARCH_ENFORCE_MODES)
    _ptx(r, key, t)
    if t.compile_units is not None and t.compile_units <= 0:
        raise r.error(f"{key}.compile_units", "must be a positive integer")
    if not 1 <= t.ptxas_threads <= MAX_PTXAS_THREADS:
        raise r.error(f"{key}.ptxas_threads", f"must be an integer from 1 (ptxas on one thread, as upstream builds) to "
                      f"{MAX_PTXAS_THREADS}", fix="ptxas_threads = 4: ptxas compiles a unit's functions on 4 threads")
    if t.ci_runner is not None:
        _one_of(r, f"{key}.ci_runner", t.ci_runner, CI_RUNNER_KINDS)
    git, sdist, local, source = _sources(r, f"{key}.source", t.source)
    _upstream_versions(r, key, t, git)
    arch_sets = read_arch_sets(r, f"{key}.arch_sets", t.arch_sets, archs, platforms)
    return Project(
        name=name, description=t.description, source=source, git=git, sdist=sdist, local=local,
        upstream_version=t.upstream_version, build_dir=t.build_dir, archs=archs, default_arch=default_arch,
        platforms=t.platforms if t.platforms is not None else tuple(platforms), backend=t.backend,
        torch_abi=t.torch_abi, build_isolation=t.build_isolation,
        min_cuda=_version(r, f"{key}.min_cuda", t.min_cuda) if t.min_cuda else None, variant_rule=t.variant_rule,
        arch_knobs=tuple(_knob(r, f"{key}.arch_knobs[{i}]", k) for i, k in enumerate(t.arch_knobs)),
        env=t.env, local_version_env=t.local_version_env, threads_env=t.threads_env,
        patches=(root / t.patches).resolve() if t.patches else None, gpu_tests=t.gpu_tests,
        compile_units=t.compile_units, repair_exclude=t.repair_exclude, knobs_valid_for=t.knobs_valid_for,
        arch_enforce=t.arch_enforce, ptx=t.ptx, upstream_ptx=t.upstream_ptx, strip_debug=t.strip_debug,
        ptxas_threads=t.ptxas_threads, unit_split=_unit_split(r, f"{key}.unit_split", t.unit_split),
        unbuildable=_unbuildable(r, key, t, archs),
        platform_tag=_platform_tag(r, f"{key}.platform_tag", t.platform_tag), build_requires=t.build_requires,
        release=read_release(t.release, f"{key}.release", project_archs=archs, torch_abi=t.torch_abi,
                             error=r.error, arch_sets=arch_sets) if t.release else None,
        arch_sets=arch_sets,
        ci_runner=t.ci_runner or ("self-hosted" if t.torch_abi else "hosted"),
        profiles=MappingProxyType({p: _profile(r, f"{key}.profiles.{p}", p, d) for p, d in t.profiles.items()}),
    )


def _unit_split(r: Reader, key: str, t: UnitSplitTable | None) -> UnitSplit | None:
    if t is None:
        return None
    if not t.env.strip() or not t.groups:
        raise r.error(key, "needs env (the variable the project's patch reads) and one or more groups",
                      fix='unit_split = { env = "MY_SPLIT", groups = [{ units = "long_*.o", parts = { _a = 0.6, _b = 0.6 } }] }')
    groups = []
    for i, g in enumerate(t.groups):
        where = f"{key}.groups[{i}]"
        if not g.units.strip():
            raise r.error(f"{where}.units", "must be a glob of unit output files", fix='units = "long_*.o"')
        if len(g.parts) < 2 or any(not s.strip() or not 0 < v <= 1 for s, v in g.parts.items()):
            raise r.error(f"{where}.parts", "must name two or more output suffixes, each with its share of the whole "
                          "unit's time (0 < share <= 1)", fix="parts = { _kfpart0 = 0.6, _kfpart1 = 0.6 }")
        groups.append(UnitGroup(units=g.units.strip(), exclude=g.exclude.strip(),
                                parts=tuple((s.strip(), float(v)) for s, v in g.parts.items())))
    return UnitSplit(env=t.env.strip(), groups=tuple(groups), note=t.note)


def _ptx(r: Reader, key: str, t: ProjectTable) -> None:
    """``ptx`` is a policy and ``upstream_ptx`` a fact about upstream's build: it cannot itself say "upstream"."""
    _one_of(r, f"{key}.ptx", t.ptx, PTX_POLICIES)
    if t.upstream_ptx == "upstream":
        raise r.error(f"{key}.upstream_ptx", "is 'upstream', which names nothing: it records what upstream's own build "
                      "ships, and ptx = \"upstream\" (the default) reads it",
                      fix=f"read upstream's build scripts and write one of: {', '.join(UPSTREAM_PTX)} (e.g. \"none\" for "
                          "-gencode arch=compute_90,code=sm_90, SASS only)")
    if t.upstream_ptx is not None:
        _one_of(r, f"{key}.upstream_ptx", t.upstream_ptx, UPSTREAM_PTX)


def _profile(r: Reader, key: str, name: str, data: Mapping[str, Any]) -> Profile:
    if not name or not name.isascii() or not all(c.isalnum() or c in "-_" for c in name) or name != name.lower():
        raise r.error(key, "is not a valid profile name",
                      fix="use lower-case ASCII letters, digits, '-' and '_' (it names the job profile kept per build profile)")
    profile = Profile(name=name, **r.values(Profile, data, key, skip=("name",)))
    if profile.compile_units is not None and profile.compile_units <= 0:
        raise r.error(f"{key}.compile_units", "must be a positive integer")
    return profile


def _upstream_versions(r: Reader, key: str, t: ProjectTable, git: GitSource | None) -> None:
    """``upstream_version`` is a PEP 440 version (whose local label, if it is a commit, is the pin's);
    ``knobs_valid_for`` a specifier that needs it."""
    if t.upstream_version is not None:
        try:
            version = Version(t.upstream_version)
        except InvalidVersion:
            raise r.error(f"{key}.upstream_version", f"is not a PEP 440 version: {t.upstream_version!r}",
                          fix="write the version upstream gives this pin, e.g. \"0.6.17\" or \"1.0.0+9241ae3\"") from None
        label = (version.local or "").removeprefix("g")
        if git is not None and re.fullmatch(r"[0-9a-f]{7,40}", label) and not git.commit.startswith(label):
            raise r.error(f"{key}.upstream_version", f"names commit {label}, and the pin is {git.commit[:12]} (a pin "
                          "bump that kept the old version would keep knobs checked for the old commit)",
                          fix=f"run `kforge audit` on the new pin, then set upstream_version to its version "
                              f"(e.g. {version.public}+{git.commit[:7]}) and widen knobs_valid_for")
    if t.knobs_valid_for is not None:
        try:
            SpecifierSet(t.knobs_valid_for)
        except InvalidSpecifier:
            raise r.error(f"{key}.knobs_valid_for", f"is not a version specifier: {t.knobs_valid_for!r}",
                          fix="write it like \">=0.6.17,<0.7\" or \"==3.0.0\"") from None
        if t.upstream_version is None:
            raise r.error(f"{key}.knobs_valid_for", "needs upstream_version (the version it is compared with)",
                          fix="add upstream_version = \"...\" for the pinned source")


def _platform_tag(r: Reader, key: str, text: str | None) -> str | None:
    """The spelling only: config stays importable without auditwheel (nox imports it), so whether
    auditwheel knows the tag is checked by kforge.wheels.platformtag when the plan is made."""
    if text is None:
        return None
    raw = text.strip()
    if not _MANYLINUX_TAG.match(raw):
        raise r.error(key, f"is not a manylinux platform tag: {text!r}", fix="write it like \"manylinux_2_28\"")
    return raw


def _sources(r: Reader, key: str, t: SourceTable) -> tuple[GitSource | None, SdistSource | None, LocalSource | None, Source]:
    git = replace(t.git, commit=t.git.commit.strip().lower()) if t.git else None
    if git and (len(git.commit) != 40 or any(c not in "0123456789abcdef" for c in git.commit)):
        raise r.error(f"{key}.git.commit", f"must be a full 40-hex commit id, not {git.commit!r}")
    sdist = replace(t.sdist, sha256=t.sdist.sha256.strip().lower()) if t.sdist else None
    if sdist and (len(sdist.sha256) != 64 or any(c not in "0123456789abcdef" for c in sdist.sha256)):
        raise r.error(f"{key}.sdist.sha256", "must be 64 hex digits")
    local = LocalSource(path=t.local) if t.local is not None else None
    declared = {"git": git, "sdist": sdist, "local": local}
    present = [k for k, v in declared.items() if v is not None]
    if not present:
        raise r.error(key, "declares no source", fix="give one of git, sdist, local")
    use = t.use or present[0]
    _one_of(r, f"{key}.use", use, tuple(declared), "must be one of git, sdist, local")
    chosen = declared[use]
    if chosen is None:
        raise r.error(f"{key}.use", f"is '{use}' but no {use} source is declared", fix=f"add {use} = ... or change use")
    return git, sdist, local, chosen


def _knob(r: Reader, key: str, k: ArchKnob) -> ArchKnob:
    _one_of(r, f"{key}.format", k.format, tuple(RENDERERS), f"'{k.format}' is not a known format")
    if k.format == "disable-flags" and (k.prefix is None or not k.families):
        raise r.error(key, "needs prefix and families for format 'disable-flags'")
    if k.format != "disable-flags" and k.env is None:
        raise r.error(key, f"needs env = \"VARIABLE\" for format '{k.format}'")
    if k.families and k.format != "disable-flags":
        raise r.error(f"{key}.families", f"only means something for format 'disable-flags', not '{k.format}'")
    return k


def _rule(r: Reader, key: str, t: RuleTable, projects: Mapping[str, Project],
          platforms: Mapping[str, Platform]) -> MatrixRule:
    if t == RuleTable():
        raise r.error(key, "is empty: it would match every target", fix="give project, arch and/or platform")
    for p in t.project or ():
        _one_of(r, f"{key}.project", p, tuple(projects), f"'{p}' is not a declared project")
    for p in t.platform or ():
        _one_of(r, f"{key}.platform", p, tuple(platforms), f"'{p}' is not a declared platform")
    archs = tuple(read_arch(r, f"{key}.arch", a) for a in t.arch) if t.arch is not None else None
    return MatrixRule(project=t.project, arch=archs, platform=t.platform)


def ptxas_threads(project_value: int, option: int | None) -> tuple[int, str]:
    """A build's ptxas threads (``--ptxas-threads`` / ``KFORGE_PTXAS_THREADS``, else the project's), and from where."""
    if option is None:
        return project_value, "forge.toml ptxas_threads"
    if option > MAX_PTXAS_THREADS:
        raise ConfigError(f"--ptxas-threads / KFORGE_PTXAS_THREADS = {option} is more than {MAX_PTXAS_THREADS}",
                          why="with --split-compile N, one compile unit's ptxas runs up to N threads",
                          fix=f"give a number from 1 to {MAX_PTXAS_THREADS}; 4 covers a long unit's tail on an idle host")
    return option, "--ptxas-threads / KFORGE_PTXAS_THREADS"
