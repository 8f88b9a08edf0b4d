"""Load and validate ``forge.toml`` into frozen dataclasses.

Every mistake is a :class:`~kforge.errors.ConfigError` that names the key path
(``projects.flashmla.archs[2]``), what was wrong, and a "did you mean" where one fits.
Nothing here touches the environment: :func:`load_forge` reads one file.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.version import InvalidVersion, Version

from kforge.arch import Arch, parse_arch
from kforge.archrender import RENDERERS
from kforge.errors import ArchError, ConfigError, did_you_mean
from kforge.sources import GitSource, LocalSource, SdistSource, Source

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FORGE_FILE = "forge.toml"
BACKENDS = ("native", "cibuildwheel", "cmake")
VARIANT_RULES = ("declared", "flashinfer")
RELEASE_SET = "release"  # the arch set whose wheels carry no arch label (docs/forge-toml.md, "Wheel names")


@dataclass(frozen=True)
class Toolchains:
    cuda: tuple[Version, ...]
    torch: tuple[Version, ...]
    python: tuple[str, ...]


@dataclass(frozen=True)
class Platform:
    name: str  # linux-x86_64
    alias: str  # linux
    os: str  # linux | windows
    machine: str
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def suffix_names(self) -> tuple[str, ...]:
        return (self.name, self.alias) if self.alias else (self.name,)


@dataclass(frozen=True)
class ArchKnob:
    """How a project reads its arch list: one environment variable (or a family of flags)."""

    format: str  # a key of kforge.archrender.RENDERERS
    env: str | None = None  # the variable that receives the rendered list
    prefix: str | None = None  # disable-flags: FLASH_MLA_DISABLE_
    value: str = "1"  # disable-flags: the value written for a disabled family
    families: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    only: tuple[int, ...] | None = None  # render only archs whose number (major*10+minor) is listed


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    env: Mapping[str, str]


@dataclass(frozen=True)
class GpuTests:
    paths: tuple[str, ...]  # relative to the project's source tree
    args: tuple[str, ...] = ()


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
# Reading tables with key paths


class _Table:
    """One TOML table with its key path; every read checks the type, unknown keys are errors."""

    def __init__(self, data: Any, path: str, allowed: tuple[str, ...], file: Path) -> None:
        self.path, self.file = path, file
        if not isinstance(data, dict):
            raise self.error(path, f"must be a table, not {_tname(data)}")
        self.data = data
        for key in data:
            if key not in allowed:
                raise self.error(
                    f"{path}.{key}" if path else key,
                    f"is not a known key{did_you_mean(key, allowed)}",
                    fix=f"the keys allowed here are: {', '.join(allowed)}",
                )

    def error(self, key: str, problem: str, *, fix: str | None = None) -> ConfigError:
        return ConfigError(
            f"{self.file.name}: {key} {problem}",
            fix=fix or f"edit {self.file} (see docs/forge-toml.md for every key)",
        )

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, typ: type | tuple[type, ...], default: Any = ..., *, required: bool = False) -> Any:
        if name not in self.data:
            if required or default is ...:
                raise self.error(self.key(name), "is missing", fix=f"add `{name} = ...` under [{self.path}]")
            return default
        value = self.data[name]
        if isinstance(value, bool) and typ in (int, float):
            raise self.error(self.key(name), f"must be {typ.__name__}, not bool")
        if not isinstance(value, typ):
            want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in (typ if isinstance(typ, tuple) else (typ,)))
            raise self.error(self.key(name), f"must be {_article(want)}, not {_tname(value)} ({value!r})")
        return value

    def str_list(self, name: str, default: Any = ...) -> Any:
        """A string or an array of strings, as a tuple of stripped strings (or ``default`` when absent)."""
        if name not in self.data:
            if default is ...:
                raise self.error(self.key(name), "is missing", fix=f"add `{name} = [...]` under [{self.path}]")
            return tuple(default) if isinstance(default, list) else default
        value = self.get(name, (list, str))
        if isinstance(value, str):
            value = [value]
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.error(f"{self.key(name)}[{i}]", f"must be a string, not {_tname(item)} ({item!r})")
        return tuple(item.strip() for item in value)

    def env(self, name: str) -> Mapping[str, str]:
        table = self.get(name, dict, {})
        out: dict[str, str] = {}
        for key, value in table.items():
            if isinstance(value, bool):
                value = "1" if value else "0"
            if not isinstance(value, (str, int)):
                raise self.error(f"{self.key(name)}.{key}", f"must be a string, not {_tname(value)}")
            out[key.strip()] = normalise_env_value(str(value))
        return MappingProxyType(out)

    def sub(self, name: str, allowed: tuple[str, ...]) -> _Table:
        return _Table(self.data[name], self.key(name), allowed, self.file)


def normalise_env_value(value: str) -> str:
    """No stray whitespace: strip the ends and collapse runs (``"4 "`` broke NVCC_THREADS once)."""
    return " ".join(value.split())


_TYPE_NAMES = {dict: "table", list: "array", str: "string", int: "integer", float: "float", bool: "boolean"}


def _tname(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _version(table: _Table, key: str, text: Any) -> Version:
    try:
        return Version(str(text))
    except InvalidVersion:
        raise table.error(key, f"is not a version: {text!r}", fix="write it as MAJOR.MINOR, e.g. \"12.8\"") from None


def _arch(table: _Table, key: str, text: str) -> Arch:
    try:
        return parse_arch(text)
    except ArchError as exc:
        raise table.error(key, f"is not a known CUDA arch: {exc.what}", fix=exc.fix) from None


# ---------------------------------------------------------------------------------------------


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
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", fix="check the path and its permissions") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path.name} is not valid TOML: {exc}",
            fix=f"fix the syntax at that line of {path}",
        ) from None
    return parse_forge(data, root=root_path, path=path)


def parse_forge(data: dict[str, Any], *, root: Path, path: Path) -> Forge:
    top = _Table(data, "", ("toolchains", "platforms", "projects", "matrix"), path)

    tc = top.sub("toolchains", ("cuda", "torch", "python")) if "toolchains" in data else None
    toolchains = Toolchains(
        cuda=tuple(_version(tc, "toolchains.cuda", v) for v in tc.str_list("cuda", ["13.0"])) if tc else (Version("13.0"),),
        torch=tuple(_version(tc, "toolchains.torch", v) for v in tc.str_list("torch", [])) if tc else (),
        python=tc.str_list("python", ["3.11"]) if tc else ("3.11",),
    )

    platforms: dict[str, Platform] = {}
    plat_tables = top.get("platforms", dict, required=True)
    for name in plat_tables:
        t = top.sub("platforms", tuple(plat_tables)).sub(name, ("alias", "os", "machine", "env"))
        os_name = t.get("os", str, required=True)
        if os_name not in ("linux", "windows"):
            raise t.error(t.key("os"), f"must be 'linux' or 'windows', not {os_name!r}")
        platforms[name] = Platform(
            name=name, alias=t.get("alias", str, ""), os=os_name, machine=t.get("machine", str, ""), env=t.env("env")
        )
    if not toolchains.cuda or not toolchains.python:
        raise top.error("toolchains.cuda" if not toolchains.cuda else "toolchains.python", "is empty",
                        fix="list at least one version, e.g. cuda = [\"13.0\"], python = [\"3.11\"]")
    seen_names: dict[str, str] = {}
    for plat in platforms.values():
        for n in plat.suffix_names:
            if n in seen_names and seen_names[n] != plat.name:
                raise top.error(f"platforms.{plat.name}.alias", f"'{n}' is already used by platforms.{seen_names[n]}")
            seen_names[n] = plat.name

    projects: dict[str, Project] = {}
    proj_tables = top.get("projects", dict, required=True)
    if not proj_tables:
        raise top.error("projects", "is empty", fix="declare at least one [projects.NAME] table")
    proj_parent = top.sub("projects", tuple(proj_tables))
    for name in proj_tables:
        projects[name] = _parse_project(proj_parent, name, platforms, root)

    exclude: tuple[MatrixRule, ...] = ()
    include: tuple[MatrixRule, ...] = ()
    if "matrix" in data:
        m = top.sub("matrix", ("exclude", "include"))
        exclude = _parse_rules(m, "exclude", projects, platforms)
        include = _parse_rules(m, "include", projects, platforms)

    return Forge(
        root=root,
        path=path,
        toolchains=toolchains,
        platforms=MappingProxyType(platforms),
        projects=MappingProxyType(projects),
        exclude=exclude,
        include=include,
    )


_PROJECT_KEYS = (
    "description", "source", "upstream_version", "build_dir", "archs", "default_arch", "platforms", "backend",
    "torch_abi", "build_isolation", "min_cuda", "variant_rule", "arch_knobs", "env", "local_version_env",
    "threads_env", "patches", "gpu_tests", "compile_units", "profiles", "repair_exclude", "arch_sets",
)  # fmt: skip


def _parse_project(parent: _Table, name: str, platforms: Mapping[str, Platform], root: Path) -> Project:
    if not name or not all(c.isalnum() or c in "-_" for c in name) or name != name.lower():
        raise parent.error(f"projects.{name}", "is not a valid project name", fix="use lower-case letters, digits, '-'")
    t = parent.sub(name, _PROJECT_KEYS)

    # --- source
    src = t.sub("source", ("use", "git", "sdist", "local")) if "source" in t.data else None
    if src is None:
        raise t.error(t.key("source"), "is missing", fix="add source = { git = {...} } or { sdist = {...} } or { local = \"kernels/NAME\" }")
    git = sdist = local = None
    if "git" in src.data:
        g = src.sub("git", ("path", "url", "commit"))
        commit = g.get("commit", str, required=True).strip().lower()
        if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
            raise g.error(g.key("commit"), f"must be a full 40-hex commit id, not {commit!r}")
        git = GitSource(path=g.get("path", str, required=True), url=g.get("url", str, required=True), commit=commit)
    if "sdist" in src.data:
        s = src.sub("sdist", ("name", "version", "sha256", "index_url"))
        sha = s.get("sha256", str, required=True).strip().lower()
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise s.error(s.key("sha256"), "must be 64 hex digits")
        sdist = SdistSource(
            name=s.get("name", str, required=True),
            version=s.get("version", str, required=True),
            sha256=sha,
            index_url=s.get("index_url", str, None),
        )
    if "local" in src.data:
        local = LocalSource(path=src.get("local", str))
    declared = {"git": git, "sdist": sdist, "local": local}
    present = [k for k, v in declared.items() if v is not None]
    if not present:
        raise src.error(src.path, "declares no source", fix="give one of git, sdist, local")
    use = src.get("use", str, present[0])
    if use not in declared:
        raise src.error(src.key("use"), f"must be one of git, sdist, local{did_you_mean(use, declared)}")
    if declared[use] is None:
        raise src.error(src.key("use"), f"is '{use}' but no {use} source is declared", fix=f"add {use} = ... or change use")
    source = declared[use]

    # --- archs
    arch_texts = t.str_list("archs", ...)
    archs: list[Arch] = []
    for i, text in enumerate(arch_texts or ()):
        arch = _arch(t, f"{t.key('archs')}[{i}]", text)
        if any(a.base == arch.base for a in archs):
            raise t.error(f"{t.key('archs')}[{i}]", f"lists {arch.base.sm} twice")
        archs.append(arch)
    if not archs:
        raise t.error(t.key("archs"), "is empty", fix="list the archs this project can build, e.g. [\"sm_90a\"]")
    default_text = t.get("default_arch", str, None)
    default_arch = _arch(t, t.key("default_arch"), default_text) if default_text else archs[-1]
    if not any(a.base == default_arch.base for a in archs):
        raise t.error(t.key("default_arch"), f"is {default_arch.sm}, which is not in archs")

    plats = t.str_list("platforms", tuple(platforms))
    for i, p in enumerate(plats):
        if p not in platforms:
            raise t.error(f"{t.key('platforms')}[{i}]", f"'{p}' is not a declared platform{did_you_mean(p, platforms)}")

    backend = t.get("backend", str, "native")
    if backend not in BACKENDS:
        raise t.error(t.key("backend"), f"'{backend}' is not a backend{did_you_mean(backend, BACKENDS)}",
                      fix=f"use one of: {', '.join(BACKENDS)}")
    variant_rule = t.get("variant_rule", str, "declared")
    if variant_rule not in VARIANT_RULES:
        raise t.error(t.key("variant_rule"), f"must be one of {', '.join(VARIANT_RULES)}{did_you_mean(variant_rule, VARIANT_RULES)}")

    knobs: list[ArchKnob] = []
    for i, raw in enumerate(t.get("arch_knobs", list, [])):
        k = _Table(raw, f"{t.key('arch_knobs')}[{i}]", ("env", "format", "prefix", "value", "families", "only"), t.file)
        fmt = k.get("format", str, required=True)
        if fmt not in RENDERERS:
            raise k.error(k.key("format"), f"'{fmt}' is not a known format{did_you_mean(fmt, RENDERERS)}",
                          fix=f"use one of: {', '.join(RENDERERS)}")
        families: dict[str, tuple[int, ...]] = {}
        if fmt == "disable-flags":
            if "prefix" not in k.data or "families" not in k.data:
                raise k.error(k.path, "needs prefix and families for format 'disable-flags'")
            for fam, nums in k.get("families", dict).items():
                if not isinstance(nums, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in nums):
                    raise k.error(f"{k.key('families')}.{fam}", "must be an array of arch numbers, e.g. [100, 103]")
                families[fam] = tuple(nums)
        elif "env" not in k.data:
            raise k.error(k.path, f"needs env = \"VARIABLE\" for format '{fmt}'")
        only = k.get("only", list, None)
        for j, num in enumerate(only or ()):
            if not isinstance(num, int) or isinstance(num, bool):
                raise k.error(f"{k.key('only')}[{j}]", f"must be an arch number such as 120, not {num!r}")
        if "families" in k.data and fmt != "disable-flags":
            raise k.error(k.key("families"), f"only means something for format 'disable-flags', not '{fmt}'")
        if isinstance(k.data.get("value"), bool):
            raise k.error(k.key("value"), "must be a string such as \"1\" or \"TRUE\", not a boolean")
        knobs.append(ArchKnob(
            format=fmt,
            env=k.get("env", str, None),
            prefix=k.get("prefix", str, None),
            value=normalise_env_value(str(k.get("value", (str, int), "1"))),
            families=MappingProxyType(families),
            only=tuple(only) if only is not None else None,
        ))

    min_cuda_text = t.get("min_cuda", str, None)
    patches_text = t.get("patches", str, None)

    gpu_tests = None
    if "gpu_tests" in t.data:
        gt = t.sub("gpu_tests", ("paths", "args"))
        gpu_tests = GpuTests(paths=gt.str_list("paths", ...), args=gt.str_list("args", ()))

    profiles: dict[str, Profile] = {}
    if "profiles" in t.data:
        pt = t.sub("profiles", tuple(t.get("profiles", dict)))
        for pname in pt.data:
            p = pt.sub(pname, ("description", "env"))
            profiles[pname] = Profile(name=pname, description=p.get("description", str, ""), env=p.env("env"))

    units = t.get("compile_units", int, None)
    if units is not None and units <= 0:
        raise t.error(t.key("compile_units"), "must be a positive integer")

    return Project(
        name=name,
        description=t.get("description", str, ""),
        source=source,
        git=git,
        sdist=sdist,
        local=local,
        upstream_version=t.get("upstream_version", str, None),
        build_dir=t.get("build_dir", str, "."),
        archs=tuple(archs),
        default_arch=next(a for a in archs if a.base == default_arch.base),
        platforms=plats,
        backend=backend,
        torch_abi=t.get("torch_abi", bool, False),
        build_isolation=t.get("build_isolation", bool, True),
        min_cuda=_version(t, t.key("min_cuda"), min_cuda_text) if min_cuda_text else None,
        variant_rule=variant_rule,
        arch_knobs=tuple(knobs),
        env=t.env("env"),
        local_version_env=t.get("local_version_env", str, None),
        threads_env=t.get("threads_env", str, "NVCC_THREADS"),
        patches=(root / patches_text).resolve() if patches_text else None,
        gpu_tests=gpu_tests,
        compile_units=units,
        profiles=MappingProxyType(profiles),
        repair_exclude=t.str_list("repair_exclude", ()),
        arch_sets=_parse_arch_sets(t, archs, platforms),
    )


def _parse_arch_sets(t: _Table, archs: list[Arch], platforms: Mapping[str, Platform]) -> Mapping[str, tuple[Arch, ...]]:
    """``arch_sets = { release = ["sm_80", "sm_90"] }``: each name a target token, each arch a declared one."""
    sets: dict[str, tuple[Arch, ...]] = {}
    for name in t.get("arch_sets", dict, {}):
        key = f"{t.key('arch_sets')}.{name}"
        if not name or not name[0].isalpha() or not all(c.isalnum() or c == "_" for c in name) or name != name.lower():
            raise t.error(key, "is not a valid arch set name",
                          fix="use lower-case letters, digits and '_', starting with a letter (it becomes part of target ids)")
        if _is_arch_spelling(name) or name in {n for p in platforms.values() for n in p.suffix_names}:
            raise t.error(key, f"'{name}' reads as an arch or a platform in a target id", fix="pick another name, e.g. release")
        texts = t.sub("arch_sets", tuple(t.data["arch_sets"])).str_list(name, ...)
        chosen: list[Arch] = []
        for i, text in enumerate(texts):
            arch = _arch(t, f"{key}[{i}]", text)
            declared = next((a for a in archs if a.base == arch.base), None)
            if declared is None:
                raise t.error(f"{key}[{i}]", f"is {arch.sm}, which is not in {t.key('archs')}",
                              fix=f"use archs the project declares: {', '.join(a.sm for a in archs)}")
            if arch.variant and arch.variant != declared.variant:
                raise t.error(f"{key}[{i}]", f"is {arch.sm}, but {t.key('archs')} declares {declared.sm}",
                              fix=f"write {declared.sm} (or the plain {declared.base.sm})")
            if any(a.base == declared.base for a in chosen):
                raise t.error(f"{key}[{i}]", f"lists {declared.base.sm} twice")
            chosen.append(declared)
        if not chosen:
            raise t.error(key, "is empty", fix="name at least one arch")
        sets[name] = tuple(sorted(chosen))
    return MappingProxyType(sets)


def _is_arch_spelling(text: str) -> bool:
    try:
        parse_arch(text)
    except ArchError:
        return False
    return True


def _parse_rules(m: _Table, key: str, projects: Mapping[str, Project], platforms: Mapping[str, Platform]) -> tuple[MatrixRule, ...]:
    rules = []
    for i, raw in enumerate(m.get(key, list, [])):
        r = _Table(raw, f"{m.key(key)}[{i}]", ("project", "arch", "platform"), m.file)
        if not r.data:
            raise r.error(r.path, "is empty: it would match every target", fix="give project, arch and/or platform")
        proj = r.str_list("project", None)
        for p in proj or ():
            if p not in projects:
                raise r.error(r.key("project"), f"'{p}' is not a declared project{did_you_mean(p, projects)}")
        plat = r.str_list("platform", None)
        for p in plat or ():
            if p not in platforms:
                raise r.error(r.key("platform"), f"'{p}' is not a declared platform{did_you_mean(p, platforms)}")
        arch_texts = r.str_list("arch", None)
        archs = tuple(_arch(r, r.key("arch"), a) for a in arch_texts) if arch_texts is not None else None
        rules.append(MatrixRule(project=proj, arch=archs, platform=plat))
    return tuple(rules)
