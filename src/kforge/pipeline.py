"""The build chain: plan -> source -> patches -> toolchain -> build -> repair -> doctor -> report -> publish.

Each step takes the plan (and the previous step's frozen result) and nothing else. A failure in any
step raises its own :class:`~kforge.errors.KforgeError`; nothing reaches the wheelhouse unless every
step before publish passed, and publish itself is atomic.
"""

from __future__ import annotations

import os
import platform as _platform
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from kforge import archenforce, doctor, jobs, patches, repair, report, sources, toolchain, wheelhouse
from kforge.backends import BuildRequest, BuildResult, get_backend
from kforge.config import Forge
from kforge.doctor.judgement import Judgement
from kforge.errors import BuildError, DoctorError, ToolchainError
from kforge.host import HostFacts
from kforge.log import StepLog
from kforge.plan import PROVISIONABLE_FROM, Plan
from kforge.series import load_series

STEPS = ("source", "patches", "toolchain", "build", "report", "repair", "doctor", "publish")


@dataclass(frozen=True)
class BuildOutcome:
    plan: Plan
    wheel: Path  # the published wheel (cmake backend: the verified C library archive)
    manifest: Path | None  # None for the cmake backend's archive, which is not published
    doctor: doctor.WheelReport | None
    report_json: Path
    timeline: Path
    seconds: float
    repaired_tag: str
    wheels: tuple[Path, ...] = ()  # every published wheel (cibuildwheel: one per Python)


def work_dir_for(root: Path, plan: Plan) -> Path:
    """Scratch space of one target (source copy, build dirs, logs, report): <root>/.kforge/work/<target>."""
    return root / ".kforge" / "work" / plan.id


def _toolchain_env(plan: Plan, environ: Mapping[str, str], cache_dir: Path, log: StepLog) -> tuple[dict[str, str], toolchain.Nvcc]:
    cuda = str(plan.toolchain.cuda)
    try:
        nvcc = toolchain.find_nvcc(environ, cuda=cuda)
    except ToolchainError:
        if plan.toolchain.cuda < PROVISIONABLE_FROM:
            raise
        log.info(f"CUDA {cuda} is not installed: provisioning nvidia-cuda-nvcc=={cuda}.* from PyPI")
        nvcc = toolchain.provision_cuda(cuda, cache_dir / "toolkits")
    log.info(f"nvcc {nvcc.version} at {nvcc.path}")
    env = dict(environ)
    env.update(plan.env)
    env.update(nvcc.env())
    env["PATH"] = str(nvcc.home / "bin") + (":" + env["PATH"] if env.get("PATH") else "")
    return env, nvcc


def _install_enforcement(plan: Plan, env: dict[str, str], nvcc: toolchain.Nvcc, cache: toolchain.CacheSetup | None,
                         work: Path, tree: Path, log: StepLog) -> archenforce.WrapperSetup | None:
    """Route every nvcc call of the build through kforge's wrapper (kforge.archenforce), unless the plan says off."""
    enforce = plan.enforce
    if enforce is None or enforce.mode == "off" or os.name != "posix" or plan.backend == "cibuildwheel":
        return None
    setup = archenforce.install(enforce, nvcc=nvcc.path, cuda_home=nvcc.home, dest=work / "nvcc-wrap",
                                launcher=cache.path if cache is not None else None,
                                short_deps=cache is not None and cache.tool == "ccache", env=env)
    env.update(setup.env)
    found = archenforce.scan_build_scripts(tree / plan.build_dir)
    log.info(f"arch enforcement {enforce.mode}: every nvcc step gets {enforce.contents()}"
             + (f"; the build scripts write their own arch flags ({len(found)} line(s), e.g. {found[0]})" if found else ""))
    return setup


def _isolate_git(env: dict[str, str], work: Path) -> None:
    """Upstream setup.py files run git (FlashMLA: `git submodule update`, versions from `git describe`).

    The scratch tree is an export without .git, under the monorepo: stop git from finding the
    monorepo's repository above it.
    """
    ceiling = str(work.parent)
    env["GIT_CEILING_DIRECTORIES"] = ceiling + (os.pathsep + env["GIT_CEILING_DIRECTORIES"] if env.get("GIT_CEILING_DIRECTORIES") else "")


def check_buildable_here(plan: Plan, host: HostFacts) -> None:
    """The native and cmake backends build for the machine they run on."""
    if plan.target.platform != host.platform and plan.backend != "cibuildwheel":
        raise BuildError(
            f"{plan.id} is a {plan.target.platform} build and this host is {host.platform}",
            why="the native and cmake backends build for the machine they run on",
            fix=f"run `nox -s build-{plan.id}` on a {plan.target.platform} machine (or CI runner)",
        )


def run_build(
    forge: Forge,
    plan: Plan,
    host: HostFacts,
    *,
    wheelhouse_root: Path,
    cache_dir: Path,
    environ: Mapping[str, str],
    allow_dirty: bool = False,
    python: str = sys.executable,
    progress: bool = True,
    ctest: bool = False,
    log: StepLog | None = None,
) -> BuildOutcome:
    log = log or StepLog(total=len(STEPS), title=plan.id)
    started = time.monotonic()
    check_buildable_here(plan, host)
    work = work_dir_for(forge.root, plan)
    work.parent.mkdir(parents=True, exist_ok=True)
    # Two builds of the same target take turns; different targets build side by side.
    with FileLock(str(work) + ".lock"):
        return _run_locked(forge, plan, host, work, started, wheelhouse_root=wheelhouse_root, cache_dir=cache_dir,
                           environ=environ, allow_dirty=allow_dirty, python=python, progress=progress, ctest=ctest,
                           log=log)


def _run_locked(forge: Forge, plan: Plan, host: HostFacts, work: Path, started: float, *, wheelhouse_root: Path,
                cache_dir: Path, environ: Mapping[str, str], allow_dirty: bool, python: str, progress: bool,
                ctest: bool, log: StepLog) -> BuildOutcome:
    project = plan.project
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)

    with log.step("source", plan.source_pin):
        prepared = sources.prepare(forge.root, project.source, work / "src", allow_dirty=allow_dirty,
                                   cache_dir=cache_dir, name=project.name)
        log.info(f"scratch copy at {prepared.tree}" + (f" ({prepared.note})" if prepared.note else ""))

    with log.step("patches", f"{len(plan.patches)} to apply" if plan.patches else "none"):
        if plan.patches:
            applied = patches.apply(prepared.tree, load_series(project.patches), plan.patch_context)
            for name in applied.applied:
                log.info(f"applied {name}")
            for name in applied.already:
                log.info(f"already applied: {name}")

    with log.step("toolchain", f"CUDA {plan.toolchain.cuda}"):
        env, nvcc = _toolchain_env(plan, environ, cache_dir, log)
        _isolate_git(env, work)
        torch_info = toolchain.detect_torch(python) if project.torch_abi else None
        if project.torch_abi and torch_info is None:
            raise ToolchainError(
                f"{project.name} builds against torch, and {python} has no torch",
                fix=f"install torch {plan.toolchain.torch or ''} into that interpreter (the build uses no isolation)".replace("  ", " "),
            )
        cache = toolchain.compiler_cache(env, wrapper_dir=work / "cc-wrappers", nvcc=nvcc.path)
        if cache is not None:
            env.update(cache.env)
            log.info(f"compiler cache: {cache.tool} ({cache.path})")
        wrapper = _install_enforcement(plan, env, nvcc, cache, work, prepared.tree, log)

    with log.step("build", f"{plan.backend}, MAX_JOBS={plan.jobs.max_jobs} NVCC_THREADS={plan.jobs.nvcc_threads}"):
        request = BuildRequest(
            ctest=ctest,
            plan=plan,
            tree=prepared.tree / plan.build_dir,
            out_dir=work / "dist",
            work_dir=work / "build",
            env=env,
            python=python,
            forge_pythons=forge.toolchains.python,
            progress=progress,
        )
        result: BuildResult = get_backend(plan.backend).build(request)
        if result.retried_with_jobs:
            log.warning(f"a compile unit ran out of memory; the build was retried with MAX_JOBS={result.retried_with_jobs}")
        if result.units:
            jobs.record(cache_dir, project.name, len(plan.archs), result.units)
        log.info(f"built {result.artifact.name} in {result.seconds:.0f} s, peak RSS {result.peak_rss / 2**30:.2f} GiB")
    with log.step("report"):
        entries = [e for path in result.ninja_logs for e in report.parse_ninja_log(path)]
        peaks = {u.output: u.peak_rss for u in result.units}
        build_report = report.build_report(entries, peaks, title=plan.id)
        sections = {}
        if wrapper is not None and plan.enforce is not None:
            summary = archenforce.summarize(wrapper.log, plan.enforce.mode)
            for line in summary.lines():
                log.info(line)
            sections["arch_enforcement"] = summary.to_dict()
        report_json, timeline = report.write_report(build_report, work / "report", sections=sections)
        log.info(f"{len(build_report.units)} compile units; timeline {timeline}")

    # torch extensions link the CUDA runtime shared (torch's own): never bundle it; ours link it statically.
    expect = [a.sm for a in plan.archs]
    # What the doctor holds binaries to (exactly the plan's SASS and PTX where it enforces archs); the
    # manifest records it, so `kforge doctor` on the published wheel judges it the same way.
    exact = plan.enforce is not None and plan.enforce.exact
    exact_ptx = plan.enforce is not None and plan.enforce.exact_ptx
    expect_doctor: list[object] = list(plan.archs)
    if exact and plan.enforce is not None:
        expect_doctor = [*plan.enforce.sass, *(plan.enforce.ptx if exact_ptx else ())]
    judged = Judgement(project=project.name, torch=project.torch_abi, cudart_shared=project.torch_abi,
                       extra_exclude=project.repair_exclude, expect=tuple(str(a) for a in expect_doctor), exact=exact,
                       exact_ptx=exact_ptx)
    policy = judged.policy
    if result.kind != "wheel":  # the cmake backend: a standalone C library, verified but not a wheel to index
        with log.step("doctor", "expects " + " ".join(expect)):
            binaries = sorted(p for p in (work / "build" / "prefix").glob("**/*") if not p.is_symlink() and (p.suffix in (".so", ".dll")
                              or ".so." in p.name))
            if not binaries:
                raise DoctorError(f"the {plan.backend} build installed no shared library", fix="check the project's install() rules")
            for binary in binaries:
                for finding in doctor.verify(doctor.inspect_binary(binary), expect_doctor, policy, exact=exact,
                                               exact_ptx=exact_ptx):
                    log.info(str(finding))
                log.info(f"{binary.name}: has {', '.join(expect)}")
        log.info(f"C library archive: {result.artifact} (the wheelhouse indexes wheels only; --backend native for one)")
        return BuildOutcome(plan=plan, wheel=result.artifact, manifest=None, doctor=None, report_json=report_json,
                            timeline=timeline, seconds=time.monotonic() - started, repaired_tag="",
                            wheels=(result.artifact,))

    wheels = list(result.artifacts or (result.artifact,))
    if plan.local_version and not project.local_version_env:
        wheels = [repair.apply_local_version(w, plan.local_version, out_dir=work / "versioned") for w in wheels]

    repaired: list[tuple[Path, str]] = []
    with log.step("repair", "done by the backend" if result.repaired else
                  "auditwheel" if plan.platform_os == "linux" else "delvewheel"):
        for wheel in wheels:
            if result.repaired:
                repaired.append((wheel, repair.platform_tag(wheel.name)))
                continue
            fixed = repair.repair_wheel(wheel, work / "repaired", platform=plan.platform_os, policy=policy,
                                        lib_paths=[nvcc.home / "lib64", nvcc.home / "lib"], python=python)
            log.info(f"{fixed.wheel.name}: {fixed.tag}" + ("" if fixed.repaired else " (no binaries to repair)"))
            repaired.append((fixed.wheel, fixed.tag))

    checked: list[tuple[Path, str, doctor.WheelReport, list]] = []
    with log.step("doctor", ("exactly " if exact else "expects ") + " ".join(map(str, expect_doctor))):
        for wheel, tag in repaired:
            wheel_report = doctor.inspect_wheel(wheel)
            findings = doctor.verify(wheel_report, expect_doctor, policy, exact=exact, exact_ptx=exact_ptx)
            for finding in findings:
                log.info(str(finding))
            checked.append((wheel, tag, wheel_report, findings))

    published: list[wheelhouse.PublishedWheel] = []
    with log.step("publish", str(wheelhouse_root)):
        for wheel, tag, wheel_report, findings in checked:
            manifest = wheelhouse.Manifest(
                target=plan.id,
                project=project.name,
                archs=tuple(expect),
                source_kind=plan.source_kind,
                source_pin=prepared.pin if prepared.kind != "sdist" else plan.source_pin,
                source_dirty=prepared.dirty,
                patch_series_hash=plan.series_hash,
                patches=plan.patches,
                toolchain={
                    "nvcc": str(nvcc.version),
                    "cuda": str(plan.toolchain.cuda),
                    "torch": str(torch_info.version) if torch_info else None,
                    "python": host.python,
                    "max_jobs": plan.jobs.max_jobs,
                    "nvcc_threads": plan.jobs.nvcc_threads,
                },
                host={"platform": host.platform, "machine": _platform.node(), "cpus": host.cpus,
                      "mem_total": host.mem_total},
                built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                build_seconds=round(result.seconds, 1),
                peak_rss=result.peak_rss,
                repaired_tag=tag,
                doctor={**doctor.to_dict(wheel_report, findings), "judged_by": judged.to_dict()},
            )
            # A rebuild of the same version replaces the older wheel (atomically, with its manifest).
            done = wheelhouse.publish(wheelhouse_root, project.name, wheel, manifest, replace=True,
                                      attachments=(report_json, timeline))
            log.info(f"{done.wheel} (index: {done.index})")
            published.append(done)

    first = published[0]
    return BuildOutcome(
        plan=plan,
        wheel=first.wheel,
        manifest=first.manifest,
        doctor=checked[0][2],
        report_json=report_json,
        timeline=timeline,
        seconds=time.monotonic() - started,
        repaired_tag=checked[0][1],
        wheels=tuple(p.wheel for p in published),
    )
