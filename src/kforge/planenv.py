"""A plan's job choice and build environment: the part of the cascade that turns a project, its archs and this host
into ``MAX_JOBS`` / nvcc threads and the environment the build runs with (:func:`kforge.plan.make_plan` calls both).

The job choice reads ``--env MAX_JOBS=..`` / ``NVCC_THREADS=..`` / the project's own thread variable back into it, and
with an sccache-dist cluster (:mod:`kforge.build.distplan`) sizes the jobs by the cluster's cores; the environment is
platform, project, profile, rendered arch knobs, jobs, toolkit and ``--env``, in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from packaging.version import Version

from kforge.build import distplan, unitsplit
from kforge.build.host import HostFacts
from kforge.build.jobs import JobChoice, choose_jobs
from kforge.build.profiles import JobProfile, for_arch_count
from kforge.build.toolchain import host_include_env
from kforge.config.binarypolicy import BinaryPolicy
from kforge.config.forge import normalise_env_value
from kforge.config.model import ArchKnob, Platform, Project
from kforge.config.options import BY_NAME, PlanOptions, parse_value
from kforge.config.profilearchs import profile_conflict
from kforge.cuda.arch import Arch
from kforge.cuda.render import render_knob
from kforge.errors import ArchError, ConfigError

__all__ = ["GENERIC_THREADS", "build_env", "plan_jobs"]

#: The thread variable every project gets (a project's own ``threads_env`` gets the same value).
GENERIC_THREADS = "NVCC_THREADS"


def plan_jobs(project: Project, host: HostFacts, options: PlanOptions, profile: JobProfile, archs: tuple[Arch, ...],
              units: int | None, dist: distplan.DistCluster | None = None) -> JobChoice:
    """The job choice, with ``--env MAX_JOBS=..`` / ``NVCC_THREADS=..`` / ``<threads_env>=..`` read back into it.

    The profile is taken to the plan's arch count first (nvcc threads only pay with more than one arch); ``units``
    is the build's compile-unit count from forge.toml (the build profile's, else the project's), if declared. With an
    sccache-dist cluster that answered (``dist``), the cores are the cluster's and the memory this host's."""
    profile = for_arch_count(profile, max(1, len(archs)), archs=tuple(a.major * 10 + a.minor for a in archs))
    max_jobs, threads = options.max_jobs, options.nvcc_threads
    if options.env.get("MAX_JOBS", "").strip():
        max_jobs = parse_value(BY_NAME["max_jobs"], options.env["MAX_JOBS"], "--env MAX_JOBS")
    for var in dict.fromkeys((GENERIC_THREADS, project.threads_env)):  # the project's own name wins
        if options.env.get(var, "").strip():
            threads = parse_value(BY_NAME["nvcc_threads"], options.env[var], f"--env {var}")
    res = host.resources if dist is None or not dist.cpus else replace(
        host.resources, cpus=dist.cpus, unit_overhead=distplan.UNIT_OVERHEAD,
        source=f"{host.resources.source}; cpus: the sccache-dist cluster's")
    choice, split = unitsplit.decide(
        project.unit_split, options.split_units or "auto", profile, units,
        lambda prof, n: choose_jobs(res, prof, override_max_jobs=max_jobs, override_nvcc_threads=threads, units=n))
    return replace(choice, thread_vars=tuple(dict.fromkeys((GENERIC_THREADS, project.threads_env))),
                   split_line=split.line if split else "", split_env=tuple(split.env.items()) if split else ())


def build_env(project: Project, platform: Platform, profile: str | None, archs: tuple[Arch, ...],
              toolkit: tuple[Version, bool], jobs: JobChoice, host: HostFacts, local_version: str | None,
              extra: Mapping[str, str], binary: BinaryPolicy) -> Mapping[str, str]:
    """The build environment, in cascade order: platform, project, profile, arch knobs (with the PTX policy), jobs,
    toolkit, --env. ``toolkit`` is the plan's CUDA and whether the build uses this host's installed toolkit."""
    cuda, uses_installed = toolkit
    env: dict[str, str] = {**platform.env, **project.env}
    if profile is not None:
        if clash := profile_conflict(project, profile, archs):
            raise ConfigError(clash, why="the wheel would lack those kernels (the doctor would refuse it after the build)",
                              fix=f"build this target with another profile, or use profile {profile} for targets "
                              "without those archs")
        env.update(project.profiles[profile].env)
    for knob in project.arch_knobs:
        _check_knob_keeps_variants(project, knob, archs)
        env.update(render_knob(knob, archs, cuda, ptx=binary.render_ptx))
    env.update(jobs.env())
    if uses_installed and host.cuda_home:
        env["CUDA_HOME"] = host.cuda_home
        if host.nvcc_path:
            env["CUDACXX"] = host.nvcc_path
        env.update(host_include_env(host.cuda_home, cuda))  # a toolchain fact, for every project
    if local_version and project.local_version_env:
        env[project.local_version_env] = local_version
    env.update(extra)
    # --env NVCC_THREADS / <threads_env> were folded into the choice: every thread variable now agrees with it
    env.update({var: str(jobs.nvcc_threads) for var in jobs.thread_vars})
    return MappingProxyType(dict(sorted((k.strip(), normalise_env_value(v)) for k, v in env.items())))


def _check_knob_keeps_variants(project: Project, knob: ArchKnob, archs: tuple[Arch, ...]) -> None:
    if knob.format == "numbers" and any(a.variant for a in archs if knob.only is None or a.major * 10 + a.minor in knob.only):
        raise ArchError(
            f"{project.name} cannot build {' '.join(a.sm for a in archs if a.variant)}: its {knob.env} takes plain "
            "arch numbers, so the variant would be dropped and the wheel would lack it",
            fix=f"ask for the plain arch (e.g. {project.name}-sm{archs[0].major * 10 + archs[0].minor}), "
            "or give the project a knob that carries variants",
        )
