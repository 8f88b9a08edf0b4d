"""Target + host facts + options -> a frozen, printable :class:`Plan`.

Nothing runs before a plan exists, and every later step takes the plan as its only input.
:func:`make_plan` is one pure function that applies the configuration cascade:

    defaults -> forge.toml (platform env, project env, profile env, rendered arch knobs)
             -> KFORGE_* environment variables -> CLI flags (``--cuda``, ``--env KEY=VALUE``, ...)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from packaging.version import Version

from kforge.arch import Arch, as_cuda_version, require_supported
from kforge.archrender import default_variant, render_gencode, render_knob
from kforge.config import BACKENDS, Forge, GpuTests, Project, normalise_env_value
from kforge.errors import ArchError, ConfigError, TargetError, ToolchainError, did_you_mean
from kforge.host import HostFacts
from kforge.jobs import JobChoice, JobProfile, Resources, choose_jobs
from kforge.series import PatchContext, load_series, series_hash
from kforge.sources import GitSource, LocalSource, SdistSource
from kforge.targets import Target
from kforge.wheelname import local_version_label

#: The KFORGE_* variables that take part in the cascade, and the option each one sets.
ENV_OPTIONS = {
    "KFORGE_CUDA": "cuda",
    "KFORGE_PROFILE": "profile",
    "KFORGE_BACKEND": "backend",
    "KFORGE_MAX_JOBS": "max_jobs",
    "KFORGE_NVCC_THREADS": "nvcc_threads",
}
#: The lowest CUDA kforge can provision from PyPI (12.x ships ptxas only, no nvcc).
PROVISIONABLE_FROM = Version("13.0")


@dataclass(frozen=True)
class PlanOptions:
    cuda: str | None = None
    profile: str | None = None
    backend: str | None = None
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    build_isolation: bool | None = None  # False: build with the interpreter's packages (offline hosts)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # --env KEY=VALUE, applied last

    @classmethod
    def from_cascade(cls, environ: Mapping[str, str], **cli: Any) -> PlanOptions:
        """KFORGE_* variables first, then whatever CLI flags were given (None means 'not given')."""
        values: dict[str, Any] = {}
        for var, opt in ENV_OPTIONS.items():
            raw = environ.get(var, "").strip()
            if raw:
                values[opt] = _int_option(var, raw) if opt in ("max_jobs", "nvcc_threads") else raw
        isolation = environ.get("KFORGE_BUILD_ISOLATION", "").strip().lower()
        if isolation:
            if isolation not in ("0", "1", "true", "false", "yes", "no"):
                raise ConfigError(f"KFORGE_BUILD_ISOLATION={isolation!r} is not a yes/no value", fix="set it to 0 or 1")
            values["build_isolation"] = isolation in ("1", "true", "yes")
        for key, value in cli.items():
            if value is not None and key != "env":
                if isinstance(value, str) and not value.strip():
                    raise ConfigError(f"--{key.replace('_', '-')} is empty", fix=f"give --{key.replace('_', '-')} a value, or leave it out")
                values[key] = value
        env = dict(cli.get("env") or {})
        return cls(**values, env=MappingProxyType(env))


def _int_option(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={raw!r} is not a positive integer", fix=f"set {name} to a number such as 4, or unset it")
    return value


@dataclass(frozen=True)
class Toolchain:
    cuda: Version  # the CUDA the build will use
    cuda_from: str  # "--cuda", "KFORGE_CUDA", "nvcc", "forge.toml"
    min_cuda: Version  # what the archs (and the project) need at least
    installed_cuda: Version | None
    nvcc_path: str | None
    action: str  # "use installed nvcc" | "provision nvidia-cuda-nvcc==13.0.* from PyPI" | "missing: ..."
    torch: Version | None  # torch the wheel is built against (torch-ABI projects only)
    python: str


@dataclass(frozen=True)
class Plan:
    target: Target
    project: Project
    profile: str | None
    source_kind: str  # git | sdist | local
    source_pin: str  # commit, name==version sha256:..., or a path
    patches_dir: str | None
    patches: tuple[str, ...]  # the series entries this build applies, in order
    patch_context: PatchContext
    series_hash: str | None  # sha256 of the selected patches (the manifest records it)
    archs: tuple[Arch, ...]  # as the build will name them (after the project's variant rule)
    env: Mapping[str, str]
    nvcc_flags: tuple[str, ...]
    backend: str
    build_dir: str
    build_isolation: bool
    jobs: JobChoice
    toolchain: Toolchain
    local_version: str | None
    platform_os: str
    gpu_tests: GpuTests | None

    @property
    def id(self) -> str:
        return self.target.id

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.id,
            "project": self.project.name,
            "arch": [a.sm for a in self.archs],
            "platform": self.target.platform,
            "profile": self.profile,
            "source": {"kind": self.source_kind, "pin": self.source_pin},
            "patches": {"dir": self.patches_dir, "series": list(self.patches), "hash": self.series_hash},
            "backend": self.backend,
            "build_dir": self.build_dir,
            "build_isolation": self.build_isolation,
            "env": dict(self.env),
            "nvcc_flags": list(self.nvcc_flags),
            "jobs": {"max_jobs": self.jobs.max_jobs, "nvcc_threads": self.jobs.nvcc_threads, "reason": self.jobs.reason},
            "toolchain": {
                "cuda": str(self.toolchain.cuda),
                "cuda_from": self.toolchain.cuda_from,
                "min_cuda": str(self.toolchain.min_cuda),
                "installed_cuda": str(self.toolchain.installed_cuda) if self.toolchain.installed_cuda else None,
                "nvcc": self.toolchain.nvcc_path,
                "action": self.toolchain.action,
                "torch": str(self.toolchain.torch) if self.toolchain.torch else None,
                "python": self.toolchain.python,
            },
            "local_version": self.local_version,
            "gpu_tests": {"paths": list(self.gpu_tests.paths), "args": list(self.gpu_tests.args)} if self.gpu_tests else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---------------------------------------------------------------------------------------------


def effective_archs(project: Project, archs: tuple[Arch, ...], cuda: Version) -> tuple[Arch, ...]:
    if project.variant_rule == "flashinfer":
        return tuple(a if a.variant else default_variant(a, cuda) for a in archs)
    return archs


def _select_cuda(forge: Forge, host: HostFacts, options: PlanOptions, environ_cuda: bool) -> tuple[Version, str]:
    if options.cuda is not None:
        source = "KFORGE_CUDA" if environ_cuda else "--cuda"
        try:
            return as_cuda_version(options.cuda), source
        except ToolchainError as exc:
            raise ToolchainError(f"{source}={options.cuda!r}: {exc.what}", fix=exc.fix) from None
    if host.cuda_version is not None:
        return as_cuda_version(host.cuda_version), "nvcc"
    return forge.toolchains.cuda[0], "forge.toml"


def _source(project: Project) -> tuple[str, str]:
    src = project.source
    if isinstance(src, GitSource):
        return "git", f"{src.path} @ {src.commit} ({src.url})"
    if isinstance(src, SdistSource):
        return "sdist", f"{src.name}=={src.version} sha256:{src.sha256}"
    if isinstance(src, LocalSource):
        return "local", src.path
    raise TypeError(src)  # pragma: no cover


def make_plan(
    forge: Forge,
    target: Target,
    host: HostFacts,
    options: PlanOptions = PlanOptions(),
    *,
    job_profile: JobProfile,
    cuda_from_env: bool = False,
) -> Plan:
    """Resolve everything a build of ``target`` will do. Raises before anything runs.

    ``job_profile`` is the project's measured compile-unit profile (``kforge.jobs.load_profile``).
    """
    project = forge.project(target.project)
    platform = forge.platforms[target.platform]

    # --- profile
    profile_name = options.profile
    if profile_name is None and project.profiles:
        profile_name = "full" if "full" in project.profiles else next(iter(project.profiles))
    if profile_name is not None and profile_name not in project.profiles:
        known = ", ".join(project.profiles) or "none"
        raise TargetError(
            f"{project.name} has no build profile '{profile_name}'{did_you_mean(profile_name, project.profiles)}",
            why=f"its profiles are: {known}",
            fix="pick one of those, or drop --profile (and unset KFORGE_PROFILE, which applies to every target)",
        )

    # --- toolchain: which CUDA, and can it compile these archs?
    cuda, cuda_from = _select_cuda(forge, host, options, cuda_from_env)
    archs = effective_archs(project, target.archs, cuda)
    native = target.platform == host.platform  # a Windows target planned on Linux uses that host's toolkit
    same_as_installed = native and host.cuda_version is not None and cuda == as_cuda_version(host.cuda_version)
    require_supported(archs, cuda, nvcc_archs=host.nvcc_archs if same_as_installed else None,
                      source="installed nvcc" if same_as_installed else f"toolkit (from {cuda_from})")
    min_cuda = max(a.min_cuda for a in archs)
    if project.min_cuda and project.min_cuda > min_cuda:
        min_cuda = project.min_cuda
    if cuda < min_cuda:
        raise ToolchainError(
            f"{project.name} needs CUDA {min_cuda} or newer, and the plan selected CUDA {cuda} (from {cuda_from})",
            fix=f"pass --cuda {min_cuda} or newer, or install that toolkit",
        )
    if not native:
        action = f"build on a {target.platform} host with CUDA {cuda} (this host is {host.platform})"
    elif same_as_installed:
        action = f"use the installed nvcc ({host.nvcc_path})"
    elif cuda >= PROVISIONABLE_FROM:
        action = f"provision nvidia-cuda-nvcc=={cuda}.* from PyPI into the kforge cache"
        if cuda not in forge.toolchains.cuda:
            action += f" (CUDA {cuda} is not in forge.toml's toolchains.cuda: is it released?)"
    else:
        action = (
            f"missing: CUDA {cuda} is not installed here and CUDA 12.x has no nvcc on PyPI; "
            f"install the CUDA {cuda} toolkit and point CUDA_HOME at it"
        )

    torch = None
    if project.torch_abi:
        torch = (host.torch_version if native else None) or (forge.toolchains.torch[0] if forge.toolchains.torch else None)
    local_version = local_version_label(project, target.archs, cuda, torch)

    # --- jobs
    resources = Resources(cpus=host.cpus, mem_available=host.mem_available, mem_total=host.mem_total)
    jobs = choose_jobs(
        resources,
        job_profile,
        override_max_jobs=options.max_jobs,
        override_nvcc_threads=options.nvcc_threads,
    )

    # --- environment, in cascade order
    env: dict[str, str] = {}
    env.update(platform.env)
    env.update(project.env)
    if profile_name is not None:
        env.update(project.profiles[profile_name].env)
    for knob in project.arch_knobs:
        if knob.format == "numbers" and any(a.variant for a in archs if knob.only is None or a.major * 10 + a.minor in knob.only):
            raise ArchError(
                f"{project.name} cannot build {' '.join(a.sm for a in archs if a.variant)}: its {knob.env} takes plain "
                "arch numbers, so the variant would be dropped and the wheel would lack it",
                fix=f"ask for the plain arch (e.g. {project.name}-sm{archs[0].major * 10 + archs[0].minor}), "
                "or give the project a knob that carries variants",
            )
        env.update(render_knob(knob, archs, cuda))
    env["MAX_JOBS"] = str(jobs.max_jobs)
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs.max_jobs)
    env["NVCC_THREADS"] = env[project.threads_env] = str(jobs.nvcc_threads)
    if same_as_installed and host.cuda_home:
        env["CUDA_HOME"] = host.cuda_home
        if host.nvcc_path:
            env["CUDACXX"] = host.nvcc_path
    if local_version and project.local_version_env:
        env[project.local_version_env] = local_version
    env.update(options.env)
    env = {k.strip(): normalise_env_value(v) for k, v in env.items()}

    backend = options.backend or project.backend
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend '{backend}'{did_you_mean(backend, BACKENDS)}", fix=f"use one of: {', '.join(BACKENDS)}")
    ctx = PatchContext(platform=target.platform, archs=tuple(a.sm for a in archs),
                      upstream_version=project.upstream_version)
    series = load_series(project.patches)
    selected = series.select(ctx)
    kind, pin = _source(project)
    return Plan(
        target=target,
        project=project,
        profile=profile_name,
        source_kind=kind,
        source_pin=pin,
        patches_dir=str(project.patches.relative_to(forge.root)) if project.patches else None,
        patches=tuple(e.name for e in selected),
        patch_context=ctx,
        series_hash=series_hash(series, ctx) if selected else None,
        archs=archs,
        env=MappingProxyType(dict(sorted(env.items()))),
        nvcc_flags=render_gencode(archs),
        backend=backend,
        build_dir=project.build_dir,
        build_isolation=project.build_isolation and options.build_isolation is not False,
        jobs=jobs,
        toolchain=Toolchain(
            cuda=cuda,
            cuda_from=cuda_from,
            min_cuda=min_cuda,
            installed_cuda=host.cuda_version,
            nvcc_path=host.nvcc_path,
            action=action,
            torch=torch,
            python=host.python,
        ),
        local_version=local_version,
        platform_os=platform.os,
        gpu_tests=project.gpu_tests,
    )
