"""Run a plan's build as a list of steps: preflight -> source -> patches -> [environment] -> toolchain -> build -> report -> repair -> doctor -> publish.

Each step is a small function ``(plan, run, done) -> result``: it reads the :class:`~kforge.plan.Plan`, the
:class:`Run` (host, environment, paths and the injected :class:`Services`: backend, repairer, nvcc finder,
doctor) and the frozen results of the steps before it (:class:`Done`), and returns its own frozen result.
:func:`run_build` is the loop: the per-target lock around it, a logged and timed step per entry of
:data:`STEPS`. A failure in any step raises its own :class:`~kforge.errors.KforgeError`; nothing reaches
the wheelhouse unless every step before publish passed, and publish itself is atomic. To add a step: write
``def my_step(plan, run, done) -> MyResult``, give :class:`Done` a ``my`` field and put ``Step("my", my_step, ...)``
where it belongs in :data:`STEPS`.
"""

from __future__ import annotations

import platform as _platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from kforge import buildinputs, doctor, locking, preflight
from kforge.backends import Backend, BuildRequest, BuildResult, get_backend
from kforge.build import environment, profiles, report, reproducible, toolchain, unitsplit
from kforge.build import order as buildorder
from kforge.build import venv as buildenv
from kforge.build.host import HostFacts
from kforge.cuda import enforce as archenforce
from kforge.doctor.judgement import Judgement
from kforge.doctor.wheel import BINARY_NAME
from kforge.errors import BuildError, DoctorError, ToolchainError
from kforge.log import StepLog
from kforge.plan import PROVISIONABLE_FROM, Plan
from kforge.sources import patches
from kforge.sources import upstream as sources
from kforge.wheels import repair, wheelhouse

# ---------------------------------------------------------------------------------------------- inputs


def locate_nvcc(plan: Plan, environ: Mapping[str, str], cache_dir: Path, say: Callable[[str], None]) -> toolchain.Nvcc:
    """The plan's nvcc: the installed one of that CUDA, else (13.0 and newer) provisioned from PyPI."""
    cuda = str(plan.toolchain.cuda)
    try:
        return toolchain.find_nvcc(environ, cuda=cuda)
    except ToolchainError:
        if plan.toolchain.cuda < PROVISIONABLE_FROM:
            raise
        say(f"CUDA {cuda} is not installed: provisioning nvidia-cuda-nvcc=={cuda}.* from PyPI")
        return toolchain.provision_cuda(cuda, cache_dir / "toolkits")


@dataclass(frozen=True)
class Services:
    """What the steps call out to. :meth:`real` gives the real tools; a test passes fakes."""

    backend: Backend
    repair_wheel: Callable[..., repair.RepairResult] = repair.repair_wheel  # the repairer (auditwheel/delvewheel)
    find_nvcc: Callable[[Plan, Mapping[str, str], Path, Callable[[str], None]], toolchain.Nvcc] = locate_nvcc
    detect_torch: Callable[[str], toolchain.TorchInfo | None] = toolchain.detect_torch
    inspect_wheel: Callable[[Path], doctor.WheelReport] = doctor.inspect_wheel
    inspect_binary: Callable[[Path], doctor.BinaryReport] = doctor.inspect_binary
    provision_env: Callable[..., buildenv.BuildEnv] = buildenv.provision_env  # a variant's uv environment

    @classmethod
    def real(cls, plan: Plan) -> Services:
        return cls(backend=get_backend(plan.backend))


@dataclass(frozen=True)
class Run:
    """One build's inputs besides the plan: the host, the environment, where things go, and the services."""

    host: HostFacts
    environ: Mapping[str, str]
    wheelhouse_root: Path
    cache_dir: Path
    services: Services
    log: StepLog
    python: str = sys.executable
    allow_dirty: bool = False
    progress: bool = True
    ctest: bool = False
    replace: bool = False  # publish over a wheel of the same file name and other bytes (refused otherwise)
    wait: bool = True  # wait (visibly) for a lock another build holds; False: fail at once


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ToolchainResult:
    env: Mapping[str, str]  # the build's whole environment: os.environ + plan.env + nvcc + compiler cache
    nvcc: toolchain.Nvcc
    torch: toolchain.TorchInfo | None
    wrapper: archenforce.WrapperSetup | None = None  # kforge's nvcc wrapper, where the plan enforces archs
    order: buildorder.OrderSetup | None = None  # kforge's ninja shim, where the plan has measured unit times


@dataclass(frozen=True)
class ReportResult:
    json: Path
    timeline: Path


@dataclass(frozen=True)
class RepairedWheel:
    wheel: Path
    tag: str


@dataclass(frozen=True)
class CheckedWheel:
    wheel: Path
    tag: str
    report: doctor.WheelReport
    findings: tuple[doctor.Finding, ...]


@dataclass(frozen=True)
class DoctorResult:
    wheels: tuple[CheckedWheel, ...] = ()  # wheel builds
    binaries: tuple[Path, ...] = ()  # the cmake backend's installed libraries


@dataclass(frozen=True)
class Done:
    """The frozen results of the steps run so far, by step name (None: not run, or not part of this build)."""

    preflight: preflight.PreflightResult | None = None
    source: sources.PreparedSource | None = None
    patches: patches.ApplyResult | None = None
    environment: buildenv.BuildEnv | None = None  # the variant's provisioned environment (None: this interpreter)
    toolchain: ToolchainResult | None = None
    build: BuildResult | None = None
    report: ReportResult | None = None
    repair: tuple[RepairedWheel, ...] | None = None
    doctor: DoctorResult | None = None
    publish: tuple[wheelhouse.PublishedWheel, ...] | None = None


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
    done: Done = field(default_factory=Done, repr=False)


# ---------------------------------------------------------------------------------------------- steps


def preflight_step(plan: Plan, run: Run, done: Done) -> preflight.PreflightResult:
    """Seconds, before any compile: can the build write, lock and fill what it must (kforge.preflight)?"""
    result = preflight.run(plan, run.host, wheelhouse_root=run.wheelhouse_root, work=plan.work_dir,
                           environ=run.environ, wait=run.wait)
    info, warnings = preflight.describe(result)
    for line in info:
        run.log.info(line)
    for line in warnings:
        run.log.warning(line)
    return result


def source_step(plan: Plan, run: Run, done: Done) -> sources.PreparedSource:
    prepared = sources.prepare(plan.root, plan.source, plan.work_dir / "src", allow_dirty=run.allow_dirty,
                               cache_dir=run.cache_dir, name=plan.project.name)
    run.log.info(f"scratch copy at {prepared.tree}" + (f" ({prepared.note})" if prepared.note else ""))
    return prepared


def patches_step(plan: Plan, run: Run, done: Done) -> patches.ApplyResult:
    assert done.source is not None
    if not plan.series.entries:
        return patches.ApplyResult(done.source.tree, (), (), "")
    applied = patches.apply(done.source.tree, plan.series, plan.patch_context)
    for name in applied.applied:
        run.log.info(f"applied {name}")
    for name in applied.already:
        run.log.info(f"already applied: {name}")
    return applied


def environment_step(plan: Plan, run: Run, done: Done) -> buildenv.BuildEnv:
    """The variant's Python and torch, when this interpreter does not have them: a uv environment (cached)."""
    assert plan.provisioning is not None
    env = run.services.provision_env(plan.provisioning, run.cache_dir, index_url=plan.index_url,
                                     find_links=plan.find_links, environ=run.environ, say=run.log.info)
    run.log.info(f"{'reusing' if env.reused else 'made'} {env.path}")
    return env


def build_python(run: Run, done: Done) -> str:
    """The interpreter the build runs with: the variant's environment, else kforge's own."""
    return str(done.environment.python) if done.environment is not None else run.python


def toolchain_step(plan: Plan, run: Run, done: Done) -> ToolchainResult:
    """nvcc and torch found, then the build's environment assembled (kforge.build.environment) as the plan says."""
    assert done.source is not None
    nvcc = run.services.find_nvcc(plan, run.environ, run.cache_dir, run.log.info)
    run.log.info(f"nvcc {nvcc.version} at {nvcc.path}")
    python = build_python(run, done)
    torch = run.services.detect_torch(python) if plan.project.torch_abi else None
    if plan.project.torch_abi and torch is None:
        raise ToolchainError(
            f"{plan.project.name} builds against torch, and {python} has no torch",
            fix=f"install torch {plan.toolchain.torch or ''} into that interpreter (the build uses no isolation)".replace("  ", " "),
        )
    built = environment.assemble(run.environ, plan.env, environment_layers(plan), nvcc, done.source, run.log.info)
    return ToolchainResult(built.env, nvcc, torch, built.wrapper, built.order)


def environment_layers(plan: Plan) -> environment.Layers:
    return environment.Layers(project=plan.project.name, root=plan.root, work_dir=plan.work_dir, source=plan.source,
                              enforce=plan.enforce, order=plan.jobs.order, order_from=plan.jobs.order_from,
                              ninja_shim=plan.ninja_shim, backend=plan.backend, reproducible=reproducibility_of(plan))


def reproducibility_of(plan: Plan) -> reproducible.Reproducibility:
    """The plan's seed and path maps (a plan made by hand, without them, gets the seed alone)."""
    return plan.reproducible or reproducible.Reproducibility(seed=plan.project.name, path_maps=(),
                                                             platform_os=plan.platform_os, device_maps=False,
                                                             unmapped="the plan has no path maps")


def stripped(plan: Plan) -> bool:
    """The plan strips host debug info from the wheel's own binaries (kforge.config.binarypolicy)."""
    return plan.binary is not None and plan.binary.strip_debug


def judgement(plan: Plan) -> Judgement:
    """What the doctor holds this build's binaries to (exactly the plan's SASS, and PTX where the wrapper rewrote; no
    host debug info where the plan strips it); the manifest records it, so `kforge doctor` on the published wheel
    judges it the same way."""
    e = plan.enforce
    split = e.ptxas_threads if e is not None else None
    if e is None or not e.exact:
        return Judgement(policy=plan.repair_policy, expect=tuple(a.sm for a in plan.archs), stripped=stripped(plan),
                         ptxas_threads=split)
    return Judgement(policy=plan.repair_policy, expect=(*e.sass, *(e.ptx if e.exact_ptx else ())), exact=True,
                     exact_ptx=e.exact_ptx, stripped=stripped(plan), ptxas_threads=split)


def _verify(report: doctor.WheelReport | doctor.BinaryReport, plan: Plan) -> list[doctor.Finding]:
    j = judgement(plan)
    expect: list[object] = list(j.expect) if j.exact else list(plan.archs)
    return doctor.verify(report, expect, j.policy, exact=j.exact, exact_ptx=j.exact_ptx, stripped=j.stripped,
                         ptxas_threads=j.ptxas_threads)


def build_step(plan: Plan, run: Run, done: Done) -> BuildResult:
    assert done.source is not None and done.toolchain is not None
    request = BuildRequest(plan=plan, tree=done.source.tree / plan.build_dir, out_dir=plan.work_dir / "dist",
                           work_dir=plan.work_dir / "build", env=done.toolchain.env, python=build_python(run, done),
                           forge_pythons=plan.pythons, progress=run.progress, ctest=run.ctest)
    result = run.services.backend.build(request)
    if result.retried_with_jobs:
        run.log.warning(f"a compile unit ran out of memory; the build was retried with MAX_JOBS={result.retried_with_jobs}")
    if result.units:
        ran_with = result.retried_with_jobs or plan.jobs.max_jobs
        profiles.record(run.cache_dir, plan.project.name, len(plan.archs), result.units, build_profile=plan.profile,
                        jobs=ran_with, cpus=run.host.cpus)
    run.log.info(f"built {result.artifact.name} in {result.seconds:.0f} s, peak RSS {result.peak_rss / 2**30:.2f} GiB")
    if said := unitsplit.confirm(plan.project.unit_split, plan.jobs.split_env, result.units):
        run.log.info(said)
    return result


def report_step(plan: Plan, run: Run, done: Done) -> ReportResult:
    assert done.build is not None
    entries = [e for path in done.build.ninja_logs for e in report.parse_ninja_log(path)]
    peaks = {u.output: u.peak_rss for u in done.build.units}
    build_report = report.build_report(entries, peaks, title=plan.id)
    sections: dict[str, object] = {}
    wrapper = done.toolchain.wrapper if done.toolchain is not None else None
    if wrapper is not None and plan.enforce is not None:
        summary = archenforce.summarize(wrapper.log, plan.enforce.mode)
        for line in summary.lines():
            run.log.info(line)
        sections["arch_enforcement"] = summary.to_dict()
    order = done.toolchain.order if done.toolchain is not None else None
    if order is not None:
        for line in buildorder.summarize(order.log):
            run.log.info(line)
    report_json, timeline = report.write_report(build_report, plan.work_dir / "report", sections=sections)
    run.log.info(f"{len(build_report.units)} compile units; timeline {timeline}")
    return ReportResult(report_json, timeline)


def repair_step(plan: Plan, run: Run, done: Done) -> tuple[RepairedWheel, ...]:
    assert done.build is not None and done.toolchain is not None
    wheels = list(done.build.artifacts or (done.build.artifact,))
    if plan.local_version_in_wheel:
        wheels = [repair.apply_local_version(w, plan.local_version, out_dir=plan.work_dir / "versioned") for w in wheels]
    if done.build.repaired:
        return tuple(RepairedWheel(w, repair.platform_tag(w.name)) for w in wheels)
    home = done.toolchain.nvcc.home
    out = []
    for wheel in wheels:
        fixed = run.services.repair_wheel(wheel, plan.work_dir / "repaired", platform=plan.platform_os,
                                          repairer=plan.repairer,
                                          policy=plan.repair_policy, platform_policy=plan.platform_tag,
                                          lib_paths=[home / "lib64", home / "lib"],
                                          python=run.python, env=done.toolchain.env, strip_debug=stripped(plan))
        run.log.info(f"{fixed.wheel.name}: {fixed.tag}" + ("" if fixed.repaired else " (no binaries to repair)"))
        for note in fixed.notes:
            run.log.info(f"  {note}")
        out.append(RepairedWheel(fixed.wheel, fixed.tag))
    return tuple(out)


def doctor_wheels_step(plan: Plan, run: Run, done: Done) -> DoctorResult:
    assert done.repair is not None
    checked = []
    for fixed in done.repair:
        wheel_report = run.services.inspect_wheel(fixed.wheel)
        findings = tuple(_verify(wheel_report, plan))
        for finding in findings:
            run.log.info(str(finding))
        checked.append(CheckedWheel(fixed.wheel, fixed.tag, wheel_report, findings))
    return DoctorResult(wheels=tuple(checked))


def doctor_library_step(plan: Plan, run: Run, done: Done) -> DoctorResult:
    """The cmake backend: a standalone C library, verified but not a wheel to index."""
    assert done.build is not None
    prefix = plan.work_dir / "build" / "prefix"
    binaries = tuple(sorted(p for p in prefix.glob("**/*") if p.is_file() and not p.is_symlink()
                            and BINARY_NAME.search(p.name)))
    if not binaries:
        raise DoctorError(f"the {plan.backend} build installed no shared library", fix="check the project's install() rules")
    for binary in binaries:
        for finding in _verify(run.services.inspect_binary(binary), plan):
            run.log.info(str(finding))
        run.log.info(f"{binary.name}: has {', '.join(a.sm for a in plan.archs)}")
    run.log.info(f"C library archive: {done.build.artifact} (the wheelhouse indexes wheels only; --backend native for one)")
    return DoctorResult(binaries=binaries)


def publish_step(plan: Plan, run: Run, done: Done) -> tuple[wheelhouse.PublishedWheel, ...]:
    assert done.doctor is not None and done.report is not None
    published = []
    for checked in done.doctor.wheels:
        # Other bytes under a published file name are refused unless --replace (atomically, with the manifest).
        one = wheelhouse.publish(run.wheelhouse_root, plan.project.name, checked.wheel, manifest(plan, run, done, checked),
                                 replace=run.replace, wait=run.wait,
                                 attachments=(done.report.json, done.report.timeline))
        run.log.info(f"{one.wheel} (index: {one.index})")
        published.append(one)
    return tuple(published)


def manifest(plan: Plan, run: Run, done: Done, checked: CheckedWheel) -> wheelhouse.Manifest:
    """The provenance published next to a wheel."""
    assert done.source is not None and done.toolchain is not None and done.build is not None
    src, tc, host = done.source, done.toolchain, run.host
    return wheelhouse.Manifest(
        target=plan.id, project=plan.project.name, archs=tuple(a.sm for a in plan.archs),
        source_kind=plan.source_kind, source_pin=src.pin if src.kind != "sdist" else plan.source_pin,
        source_dirty=src.dirty, patch_series_hash=plan.series_hash, patches=plan.patches,
        toolchain={"nvcc": str(tc.nvcc.version), "cuda": str(plan.toolchain.cuda),
                   "torch": str(tc.torch.version) if tc.torch else None, "python": plan.toolchain.python,
                   "max_jobs": plan.jobs.max_jobs, "nvcc_threads": plan.jobs.nvcc_threads},
        host={"platform": host.platform, "machine": _platform.node(), "cpus": host.cpus, "mem_total": host.mem_total},
        built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        build_seconds=round(done.build.seconds, 1), peak_rss=done.build.peak_rss, repaired_tag=checked.tag,
        doctor={**doctor.to_dict(checked.report, list(checked.findings)), "judged_by": judgement(plan).to_dict()},
        variant=plan.variant.id if plan.variant else None,
        # a dirty source has no identity worth comparing: such a wheel is never taken as already released
        inputs_hash=None if src.dirty else buildinputs.inputs_hash(plan, src.pin),
    )


# ---------------------------------------------------------------------------------------------- the loop


def _always(plan: Plan) -> bool:
    return True


def _no_detail(plan: Plan, run: Run, done: Done) -> str:
    return ""


@dataclass(frozen=True)
class Step:
    name: str  # the Done field its result goes into, and the log's step name
    run: Callable[[Plan, Run, Done], object]
    detail: Callable[[Plan, Run, Done], str] = _no_detail  # the log line's detail
    when: Callable[[Plan], bool] = _always  # does this build have this step?
    locked: bool = True  # runs under the target's lock (preflight runs before it: failing fast beats queueing)


def _expects(plan: Plan, run: Run, done: Done) -> str:
    j = judgement(plan)
    return ("exactly " if j.exact else "expects ") + " ".join(j.expect) + ("; no host debug info" if j.stripped else "")


def _repair_detail(plan: Plan, run: Run, done: Done) -> str:
    if done.build is not None and done.build.repaired:
        return "done by the backend"
    return plan.repairer


def _needs_environment(plan: Plan) -> bool:
    return plan.provisioning is not None and plan.provisioning.env_needed


def _makes_wheel(plan: Plan) -> bool:
    return plan.makes_wheel


def _makes_library(plan: Plan) -> bool:
    return not plan.makes_wheel


#: The chain, in order.
STEPS: tuple[Step, ...] = (
    Step("preflight", preflight_step, lambda plan, run, done: "wheelhouse, work folder, TMPDIR, disk space, toolchain",
         locked=False),
    Step("source", source_step, lambda plan, run, done: plan.source_pin),
    Step("patches", patches_step, lambda plan, run, done: f"{len(plan.patches)} to apply" if plan.patches else "none"),
    Step("environment", environment_step, lambda plan, run, done: plan.variant.id if plan.variant else "",
         when=_needs_environment),
    Step("toolchain", toolchain_step, lambda plan, run, done: f"CUDA {plan.toolchain.cuda}"),
    Step("build", build_step, lambda plan, run, done: f"{plan.backend}, MAX_JOBS={plan.jobs.max_jobs} "
         + " ".join(f"{v}={plan.jobs.nvcc_threads}" for v in plan.jobs.thread_vars)),
    Step("report", report_step),
    Step("repair", repair_step, _repair_detail, when=_makes_wheel),
    Step("doctor", doctor_wheels_step, _expects, when=_makes_wheel),
    Step("doctor", doctor_library_step, _expects, when=_makes_library),
    Step("publish", publish_step, lambda plan, run, done: str(run.wheelhouse_root), when=_makes_wheel),
)


def steps_for(plan: Plan, steps: Sequence[Step] = STEPS) -> tuple[Step, ...]:
    """The steps this plan's build runs (the cmake backend has no repair and no publish)."""
    return tuple(s for s in steps if s.when(plan))


def check_buildable_here(plan: Plan, host: HostFacts) -> None:
    """The native and cmake backends build for the machine they run on."""
    if plan.target.platform != host.platform and plan.backend != "cibuildwheel":
        raise BuildError(f"{plan.id} is a {plan.target.platform} build and this host is {host.platform}",
                         why="the native and cmake backends build for the machine they run on",
                         fix=f"run `nox -s build-{plan.id}` on a {plan.target.platform} machine (or CI runner)")


@contextmanager
def target_lock(plan: Plan, log: StepLog, *, wait: bool = True) -> Iterator[None]:
    """Two builds of the same target take turns (the waiter says who holds it); different targets build side by side."""
    plan.work_dir.parent.mkdir(parents=True, exist_ok=True)
    with locking.hold(Path(str(plan.work_dir) + ".lock"), target=plan.id, what=f"the work folder of {plan.id}",
                      error=BuildError, wait=wait):
        yield


def run_build(plan: Plan, run: Run, *, steps: Sequence[Step] = STEPS) -> BuildOutcome:
    """Run the plan's steps in order, under the target's lock, each logged and timed."""
    started = time.monotonic()
    check_buildable_here(plan, run.host)
    done = Done()
    chosen = steps_for(plan, steps)
    for step in (s for s in chosen if not s.locked):
        with run.log.step(step.name, step.detail(plan, run, done)):
            done = replace(done, **{step.name: step.run(plan, run, done)})
    with target_lock(plan, run.log, wait=run.wait):
        if plan.work_dir.exists():
            shutil.rmtree(plan.work_dir)
        plan.work_dir.mkdir(parents=True)
        for step in (s for s in chosen if s.locked):
            with run.log.step(step.name, step.detail(plan, run, done)):
                done = replace(done, **{step.name: step.run(plan, run, done)})
    return outcome(plan, done, time.monotonic() - started)


def outcome(plan: Plan, done: Done, seconds: float) -> BuildOutcome:
    """What the build made: the published wheels (or the cmake backend's verified archive)."""
    assert done.build is not None and done.report is not None and done.doctor is not None
    rep = done.report
    if not plan.makes_wheel:
        return BuildOutcome(plan=plan, wheel=done.build.artifact, manifest=None, doctor=None, report_json=rep.json,
                            timeline=rep.timeline, seconds=seconds, repaired_tag="", wheels=(done.build.artifact,),
                            done=done)
    assert done.publish
    first = done.publish[0]
    return BuildOutcome(plan=plan, wheel=first.wheel, manifest=first.manifest, doctor=done.doctor.wheels[0].report,
                        report_json=rep.json, timeline=rep.timeline, seconds=seconds,
                        repaired_tag=done.doctor.wheels[0].tag, wheels=tuple(p.wheel for p in done.publish), done=done)
