"""Resolve a target into a complete, frozen, printable :class:`Plan`: everything a build will do, decided up front.

Nothing runs before a plan exists, and nothing after it reads forge.toml again: every later step
takes the plan (and the earlier steps' frozen results) as its only input. :func:`make_plan` is one
pure function that applies the configuration cascade:

    defaults -> forge.toml (platform env, project env, profile env, rendered arch knobs)
             -> KFORGE_* environment variables -> CLI flags (``--cuda``, ...; see kforge.config.options)
             -> ``--env KEY=VALUE`` (MAX_JOBS / NVCC_THREADS / the project's threads_env read back into the jobs)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from kforge.build import distplan
from kforge.build.host import HostFacts
from kforge.build.image import OFFICIAL_IMAGE, image_platform_tag, is_kforge_image
from kforge.build.jobs import JobChoice, jobs_sentence, order_line
from kforge.build.profiles import JobProfile
from kforge.build.reproducible import Reproducibility, plan_reproducibility, wrapper_reach
from kforge.config.binarypolicy import BinaryPolicy, binary_policy
from kforge.config.forge import ptxas_threads
from kforge.config.knowledge import require_current_knowledge
from kforge.config.model import BACKEND_NAMES, Forge, GpuTests, Project
from kforge.config.options import BY_NAME, PlanOptions
from kforge.config.repairpolicy import TORCH_LIBRARIES, RepairPolicy, default_policy
from kforge.config.source import GitSource, LocalSource, SdistSource, Source
from kforge.config.targets import Target
from kforge.config.variant import Provisioning, Variant, parse_python, parse_version, provisioning
from kforge.config.wheelname import local_version_label
from kforge.cuda.arch import Arch, as_cuda_version, require_supported
from kforge.cuda.enforce import ArchEnforcement, plan_enforcement
from kforge.cuda.render import default_variant, render_gencode
from kforge.errors import ConfigError, TargetError, ToolchainError, did_you_mean
from kforge.fsutil import work_root
from kforge.planenv import build_env, plan_jobs
from kforge.platformfloor import FloorDecision, parse_glibc, plan_floor
from kforge.sources.series import PatchContext, Series, load_series, series_hash
from kforge.wheels.repair import repairer_name

__all__ = ["PROVISIONABLE_FROM", "Plan", "PlanOptions", "Toolchain", "make_plan", "profile_name"]

#: The lowest CUDA kforge can provision from PyPI (12.x ships ptxas only, no nvcc).
PROVISIONABLE_FROM = Version("13.0")
#: The generic thread variable every plan sets (a project may add its own name: ``threads_env``).


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
    uses_installed: bool = False  # the installed nvcc (host.nvcc_path) is the one this plan builds with

    @property
    def toolkit(self) -> tuple[Version, bool]:
        """(the CUDA, whether it is the installed one): what the build environment needs of the toolchain."""
        return self.cuda, self.uses_installed


@dataclass(frozen=True)
class Plan:
    """Everything one build will do. Steps read this; none of them goes back to forge.toml."""

    target: Target
    project: Project
    root: Path  # the monorepo root (sources and patches are relative to it)
    work_dir: Path  # scratch space of this target: <root>/.kforge/work/<target>
    profile: str | None
    source: Source  # the source the build uses (git, sdist or local)
    source_kind: str  # git | sdist | local
    source_pin: str  # commit, name==version sha256:..., or a path
    patches_dir: str | None
    series: Series  # the series entries this build applies, in order (only the selected ones)
    patch_context: PatchContext
    series_hash: str | None  # sha256 of the selected patches (the manifest records it)
    archs: tuple[Arch, ...]  # as the build will name them (after the project's variant rule)
    env: Mapping[str, str]
    nvcc_flags: tuple[str, ...]
    backend: str  # one of kforge.config.model.BACKEND_NAMES
    build_dir: str
    build_isolation: bool
    jobs: JobChoice  # MAX_JOBS and the nvcc thread count, and every variable that carries it (jobs.thread_vars)
    toolchain: Toolchain
    local_version: str | None
    local_version_in_wheel: bool  # True: kforge relabels the built wheel; False: the project reads local_version_env
    platform_os: str
    pythons: tuple[str, ...]  # forge.toml's python versions (cibuildwheel builds one wheel per version)
    repair_policy: RepairPolicy  # what repair keeps out of the wheel, and what the doctor accepts as external
    gpu_tests: GpuTests | None
    image: str | None = None  # the cibuildwheel backend's Linux image (None: not a cibuildwheel Linux build)
    platform_tag: str | None = None  # manylinux_2_28: the repair must reach it, or fail naming the symbols
    platform_note: str = ""  # why platform_tag is what it is (kforge.platformfloor)
    enforce: ArchEnforcement | None = None  # kforge.cuda.enforce: the archs (and threads) the nvcc wrapper enforces
    variant: Variant | None = None  # (CUDA, torch, Python): what this build is for (kforge.config.variant)
    provisioning: Provisioning | None = None  # per part: present, or how kforge provisions it
    index_url: str | None = None  # where a provisioned environment installs from (None: uv's default)
    find_links: str | None = None  # offline wheels for a provisioned environment
    uv: str | None = None  # the host's uv (a plan with a variant environment needs it)
    repairer: str = "auditwheel"  # kforge.wheels.repair.REPAIRERS: auditwheel (Linux) or delvewheel (Windows)
    ninja_shim: bool = False  # kforge's ninja shim goes in front (a POSIX host, not a container): jobs.order applies
    reproducible: Reproducibility | None = None  # kforge.build.reproducible: seed and path maps every build of it gets
    binary: BinaryPolicy | None = None  # kforge.config.binarypolicy: which archs get PTX; host debug info stripped or kept
    dist: distplan.DistCluster | None = None  # the sccache-dist cluster the compiles go to (None: none)

    @property
    def id(self) -> str:
        return self.target.id

    @property
    def patches(self) -> tuple[str, ...]:
        """The names of the patches this build applies, in order."""
        return tuple(e.name for e in self.series.entries)

    @property
    def makes_wheel(self) -> bool:
        """The cmake backend packs a standalone C library (verified, not published); the others make wheels."""
        return self.backend != "cmake"

    def to_dict(self) -> dict[str, Any]:
        tc = self.toolchain
        return {
            "target": self.id,
            "project": self.project.name,
            "root": str(self.root),
            "work_dir": str(self.work_dir),
            "arch": [a.sm for a in self.archs],
            "platform": self.target.platform,
            "platform_os": self.platform_os,
            "profile": self.profile,
            "source": {"kind": self.source_kind, "pin": self.source_pin},
            "patches": {"dir": self.patches_dir, "series": list(self.patches), "hash": self.series_hash},
            "backend": self.backend,
            "makes_wheel": self.makes_wheel,
            "build_dir": self.build_dir,
            "build_isolation": self.build_isolation,
            "env": dict(self.env),
            "nvcc_flags": list(self.nvcc_flags),
            "jobs": {"max_jobs": self.jobs.max_jobs, "nvcc_threads": self.jobs.nvcc_threads,
                     "thread_vars": list(self.jobs.thread_vars), "reason": self.jobs.reason,
                     "predicted_seconds": self.jobs.predicted_seconds,
                     "order": [[k, round(v, 1)] for k, v in self.jobs.order], "order_from": self.jobs.order_from,
                     "split": self.jobs.split_line or None,
                     "ninja_shim": self.ninja_shim},
            "toolchain": {
                "cuda": str(tc.cuda), "cuda_from": tc.cuda_from, "min_cuda": str(tc.min_cuda),
                "installed_cuda": str(tc.installed_cuda) if tc.installed_cuda else None, "nvcc": tc.nvcc_path,
                "action": tc.action, "torch": str(tc.torch) if tc.torch else None, "python": tc.python,
            },
            "pythons": list(self.pythons),
            "local_version": self.local_version,
            "local_version_in_wheel": self.local_version_in_wheel,
            "repair": {"tool": self.repairer, "policy": self.repair_policy.name, "exclude": list(self.repair_policy.exclude),
                       "strip_debug": bool(self.binary and self.binary.strip_debug)},
            "binaries": self.binary.to_dict() if self.binary else None,
            "gpu_tests": {"paths": list(self.gpu_tests.paths), "args": list(self.gpu_tests.args)} if self.gpu_tests else None,
            "image": self.image,
            "platform_tag": self.platform_tag,
            "platform_note": self.platform_note,
            "arch_enforce": self.enforce.to_dict() if self.enforce else None,
            "variant": self.variant.id if self.variant else None,
            "provisioning": {**self.provisioning.to_dict(), "index_url": self.index_url, "find_links": self.find_links}
            if self.provisioning else None,
            "reproducible": self.reproducible.to_dict() if self.reproducible else None,
            "distribute": self.dist.to_dict() if self.dist else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self, *, verbose: bool = False) -> str:
        """The plan as ``kforge plan`` prints it (and ``kforge build`` logs it); ``verbose``: the job model's details."""
        tc = self.toolchain
        isolation = "isolated" if self.build_isolation else (
            "no build isolation: uses the variant environment's packages" if self.provisioning and self.provisioning.env_needed
            else "no build isolation: uses the build container's packages" if self.image
            else "no build isolation: uses this interpreter's packages")
        threads = " ".join(f"{v}={self.jobs.nvcc_threads}" for v in self.jobs.thread_vars)
        lines = [
            f"plan {self.id}  ({self.target.platform})",
            f"  project     {self.project.name}: {self.project.description}",
            f"  source      {self.source_kind} {self.source_pin}",
            f"  patches     {self.patches_dir or 'none'}"
            + (f" ({len(self.patches)} for this build: {', '.join(self.patches)})" if self.patches else ""),
            f"  archs       {' '.join(a.sm for a in self.archs)}",
            f"  profile     {self.profile or 'none'}",
            f"  backend     {self.backend} (build dir {self.build_dir}, {isolation})",
            f"  variant     {self.variant.id if self.variant else 'none'}",
            f"  cuda        {tc.cuda} (from {tc.cuda_from}; needs >= {tc.min_cuda}): {tc.action}",
            f"  torch       {tc.torch or 'not needed (torch-free wheel)'}"
            + (f": {self.provisioning.part('torch').how}" if self.provisioning and tc.torch else ""),
            f"  python      {tc.python}" + (f" (wheels for {', '.join(self.pythons)})" if self.backend == "cibuildwheel" else "")
            + (f": {self.provisioning.part('python').how}" if self.provisioning else ""),
            *([f"  c++ abi     {self.provisioning.part('cxx11_abi').how}"] if self.provisioning and tc.torch else []),
            *([f"  build env   uv environment in the kforge cache with {', '.join(self.provisioning.requirements) or 'no packages'}"
               + (f" (offline from {self.find_links})" if self.find_links else f" (from {self.index_url or 'uv default index'})")]
              if self.provisioning and self.provisioning.env_needed else []),
            *(["  uv          NOT FOUND, and this plan makes a uv environment: pip install uv (kforge's dev extra has it)"]
              if self.provisioning and self.provisioning.env_needed and not self.uv else []),
            *([f"  distribute  {self.dist.line()}"] if self.dist else []),
            f"  jobs        MAX_JOBS={self.jobs.max_jobs} {threads}: "
            + (self.jobs.reason if verbose else jobs_sentence(self.jobs)),
            f"  order       {order_line(self.jobs)}",
            *([f"  split       {self.jobs.split_line}"] if self.jobs.split_line else []),
            f"  version     +{self.local_version}" if self.local_version else "  version     no local label",
            f"  repair      {self.repairer}, policy {self.repair_policy.name}: keeps out {', '.join(self.repair_policy.exclude)}"
            + (f"; torch-free: no binary may need {', '.join(TORCH_LIBRARIES)}" if self.repair_policy.torch_free else ""),
            f"  work dir    {self.work_dir}",
            "  nvcc flags  " + " ".join(self.nvcc_flags),
            *(self.binary.lines(self.archs) if self.binary else []),
            f"  platform    {self.platform_tag or 'the best tag the binaries allow'}"
            + (f" ({self.platform_note})" if self.platform_note.startswith("this host") else "")
            + (f" (image {self.image})" if self.image else ""),
        ]
        if self.enforce is not None:  # kforge.cuda.enforce: what binaries hold, and how that is made true
            held = "every CUDA binary holds exactly" if self.enforce.exact else "every CUDA binary holds at least"
            lines += [f"  binaries    {held} {self.enforce.contents()} (the doctor checks it)",
                      f"  enforce     {self.enforce.describe()}"]
            if self.enforce.ptxas_asked > 1:
                lines.append(f"  ptxas       {self.enforce.ptxas_line()}")
        if self.reproducible is not None:  # kforge.build.reproducible: what makes two builds of this plan byte-identical
            first, *more = self.reproducible.describe()
            lines += [f"  repro       {first}", *(f"              {line}" for line in more)]
        lines += ["  env", *(f"    {key}={value}" for key, value in self.env.items())]
        if self.gpu_tests:
            lines.append(f"  gpu tests   {' '.join(self.gpu_tests.paths)} {' '.join(self.gpu_tests.args)}".rstrip())
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def effective_archs(project: Project, archs: tuple[Arch, ...], cuda: Version) -> tuple[Arch, ...]:
    if project.variant_rule == "flashinfer":
        return tuple(a if a.variant else default_variant(a, cuda) for a in archs)
    return archs


def make_plan(forge: Forge, target: Target, host: HostFacts, options: PlanOptions | None = None, *,
              job_profile: JobProfile) -> Plan:
    """Resolve everything a build of ``target`` will do. Raises before anything runs.

    ``job_profile`` is the project's measured compile-unit profile (``kforge.build.profiles.load_profile``).
    """
    options = options or PlanOptions()
    project = forge.project(target.project)
    require_current_knowledge(project)
    platform = forge.platforms[target.platform]
    profile = profile_name(project, options.profile)
    toolchain, archs = _toolchain(forge, project, target, host, options)
    backend = _backend(options.backend or project.backend)
    dist = host.dist if backend != "cibuildwheel" and platform.os != "windows" else None  # a container has no cluster
    jobs = plan_jobs(project, host, options, job_profile, archs, project.units(profile), dist)
    variant = Variant(cuda=Version(f"{toolchain.cuda.major}.{toolchain.cuda.minor}"), python=toolchain.python,
                      torch=toolchain.torch if project.torch_abi else None)
    local_version = local_version_label(project, target.archs, toolchain.cuda, toolchain.torch)
    binary = binary_policy(project, ptx=options.ptx, strip_debug=options.strip_debug, platform_os=platform.os, backend=backend)
    env = build_env(project, platform, profile, archs, toolchain.toolkit, jobs, host, local_version, options.env, binary)
    ctx = PatchContext(platform=target.platform, archs=tuple(a.sm for a in archs),
                       upstream_version=project.upstream_version)
    series = load_series(project.patches)
    selected = Series(series.directory, series.select(ctx), series.header)
    kind, pin = _source(project)
    nvcc_flags = render_gencode(archs, ptx=binary.render_ptx)
    enforce = _enforcement(forge, project, backend, platform.os, nvcc_flags, jobs.nvcc_threads,
                           *ptxas_threads(project.ptxas_threads, options.ptxas_threads))
    floor = _platform_tag(project, platform.os, options, _image(backend, platform.os, options), host)
    return Plan(
        target=target, project=project, root=forge.root, work_dir=work_root(forge.root) / target.id,
        profile=profile, source=project.source, source_kind=kind, source_pin=pin,
        patches_dir=str(project.patches.relative_to(forge.root)) if project.patches else None,
        series=selected, patch_context=ctx, series_hash=series_hash(series, ctx) if selected.entries else None,
        archs=archs, env=env, nvcc_flags=nvcc_flags, backend=backend, build_dir=project.build_dir,
        build_isolation=project.build_isolation and options.build_isolation is not False,
        jobs=jobs, toolchain=toolchain, local_version=local_version,
        local_version_in_wheel=bool(local_version) and not project.local_version_env,
        platform_os=platform.os, pythons=forge.toolchains.python,
        # torch extensions link the CUDA runtime shared (torch's own): never bundle it; ours link it statically.
        repair_policy=default_policy(project.name, torch=project.torch_abi, cudart_shared=project.torch_abi,
                                     extra=project.repair_exclude),
        gpu_tests=project.gpu_tests,
        image=_image(backend, platform.os, options),
        platform_tag=floor.enforce,
        platform_note=floor.note,
        enforce=enforce,
        variant=variant,
        provisioning=provisioning(variant, torch_abi=project.torch_abi, build_isolation=project.build_isolation
                                  and options.build_isolation is not False, host_python=host.python,
                                  host_torch=host.torch_version, cuda_how=toolchain.action,
                                  cuda_present=toolchain.uses_installed, build_requires=project.build_requires,
                                  container=_image(backend, platform.os, options)),
        index_url=options.index_url, find_links=options.find_links, repairer=repairer_name(platform.os), uv=host.uv,
        ninja_shim=platform.os != "windows" and backend != "cibuildwheel",  # a sh script on this host's PATH
        # the nvcc wrapper (installed unless enforcement is off; a POSIX script outside containers) maps device paths
        reproducible=plan_reproducibility(project.name, forge.root, platform.os,
                                          **wrapper_reach(enforce.wrapper, backend, enforce.mode)),
        binary=binary, dist=dist,
    )


def _image(backend: str, platform_os: str, options: PlanOptions) -> str | None:
    if backend != "cibuildwheel" or platform_os != "linux":
        if options.image:
            raise ConfigError(f"--image/KFORGE_IMAGE applies to cibuildwheel builds of Linux wheels, and this is a {backend} "
                              f"build for {platform_os}", fix="add --backend cibuildwheel, or drop the image option")
        return None
    if options.image and is_kforge_image(options.image):
        image_platform_tag(options.image)  # an unknown suite is an error now, not after the compile
    return options.image or OFFICIAL_IMAGE


def _platform_tag(project: Project, platform_os: str, options: PlanOptions, image: str | None,
                  host: HostFacts) -> FloorDecision:
    """The tag the repair must reach (kforge.platformfloor.plan_floor); a kforge image promises its glibc's tag."""
    if platform_os != "linux":
        return FloorDecision(None, "")
    kforge_image = image if image and is_kforge_image(image) else None
    return plan_floor(project.platform_tag, options.platform_tag, kforge_image if not project.platform_tag else image,
                      parse_glibc(host.glibc), project.name)


def _enforcement(forge: Forge, project: Project, backend: str, platform_os: str, flags: tuple[str, ...],
                 threads: int, ptxas_threads: int = 1, ptxas_from: str = "") -> ArchEnforcement:
    """Arch enforcement (kforge.cuda.enforce), with the build scripts scanned where the source is on disk (as checked
    out, before the patch series: what the wrapper really rewrote is in the build log)."""
    src = project.source
    tree, note = None, ""
    if isinstance(src, (GitSource, LocalSource)):
        tree = forge.root / src.path / project.build_dir
    elif project.git is not None:  # an sdist build: the same upstream's submodule, if checked out, tells
        tree = forge.root / project.git.path / project.build_dir
    else:
        note = "the sdist is not on disk before the build: the build log lists what the wrapper rewrote"
    return plan_enforcement(project.arch_enforce, flags, threads, backend=backend, platform_os=platform_os,
                            scripts_dir=tree, scan_note=note, ptxas_threads=ptxas_threads, ptxas_from=ptxas_from)


def profile_name(project: Project, asked: str | None) -> str | None:
    """The build profile a build uses (``--profile``, else the project's default); an unknown one is an error."""
    name = asked if asked is not None else project.default_profile
    if name is not None and name not in project.profiles:
        raise TargetError(
            f"{project.name} has no build profile '{name}'{did_you_mean(name, project.profiles)}",
            why=f"its profiles are: {', '.join(project.profiles) or 'none'}",
            fix="pick one of those, or drop --profile (and unset KFORGE_PROFILE, which applies to every target)",
        )
    return name


def _select_cuda(forge: Forge, host: HostFacts, options: PlanOptions) -> tuple[Version, str]:
    if options.cuda is not None:
        source = options.cuda_from or "--cuda"
        try:
            return as_cuda_version(options.cuda), source
        except ToolchainError as exc:
            raise ToolchainError(f"{source}={options.cuda!r}: {exc.what}", fix=exc.fix) from None
    if host.cuda_version is not None:
        return as_cuda_version(host.cuda_version), "nvcc"
    return forge.toolchains.cuda[0], "forge.toml"


def _toolchain(forge: Forge, project: Project, target: Target, host: HostFacts,
               options: PlanOptions) -> tuple[Toolchain, tuple[Arch, ...]]:
    """Which CUDA (and torch), and can it compile these archs?"""
    cuda, cuda_from = _select_cuda(forge, host, options)
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
    torch = None
    if options.torch is not None:
        torch = parse_version(options.torch, BY_NAME["torch"].flag, "torch")
        if not project.torch_abi:
            raise ConfigError(f"{BY_NAME['torch'].flag}={options.torch} asks for a torch variant, and {project.name} "
                              "is torch-free (torch_abi = false): its wheel serves every torch",
                              fix="drop --torch (and unset KFORGE_TORCH) for this project")
    elif project.torch_abi:
        torch = (Version(host.torch_version.public) if native and host.torch_version else None) or (
            forge.toolchains.torch[0] if forge.toolchains.torch else None)
    python = parse_python(options.python, BY_NAME["python"].flag) if options.python else host.python
    return Toolchain(cuda=cuda, cuda_from=cuda_from, min_cuda=min_cuda, installed_cuda=host.cuda_version,
                     nvcc_path=host.nvcc_path, uses_installed=same_as_installed,
                     action=_cuda_action(forge, target, host, cuda, native, same_as_installed),
                     torch=torch, python=python), archs


def _cuda_action(forge: Forge, target: Target, host: HostFacts, cuda: Version, native: bool, same: bool) -> str:
    if not native:
        return f"build on a {target.platform} host with CUDA {cuda} (this host is {host.platform})"
    if same:
        return f"use the installed nvcc ({host.nvcc_path})"
    if cuda >= PROVISIONABLE_FROM:
        action = f"provision nvidia-cuda-nvcc=={cuda}.* from PyPI into the kforge cache"
        if cuda not in forge.toolchains.cuda:
            action += f" (CUDA {cuda} is not in forge.toml's toolchains.cuda: is it released?)"
        return action
    return (f"from the system: /usr/local/cuda-{cuda} (CUDA 12.x has no nvcc on PyPI); the build fails naming it "
            f"when it is not installed: then install the CUDA {cuda} toolkit there, or point CUDA_HOME at it")


def _backend(name: str) -> str:
    if name not in BACKEND_NAMES:
        raise ConfigError(f"unknown backend '{name}'{did_you_mean(name, BACKEND_NAMES)}",
                          fix=f"use one of: {', '.join(BACKEND_NAMES)}")
    return name


def _source(project: Project) -> tuple[str, str]:
    src = project.source
    if isinstance(src, GitSource):
        return "git", f"{src.path} @ {src.commit} ({src.url})"
    if isinstance(src, SdistSource):
        return "sdist", f"{src.name}=={src.version} sha256:{src.sha256}"
    if isinstance(src, LocalSource):
        return "local", src.path
    raise TypeError(src)  # pragma: no cover
