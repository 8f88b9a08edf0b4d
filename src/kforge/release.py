"""Cut a release: plan every build of a project's release matrix, price it, skip what is already published with
identical inputs, build the rest one after another (one job budget, one compiler cache), write the release manifest.

:func:`plan_release` is the analysis: one complete :class:`~kforge.plan.Plan` per (archs, variant) of
``[projects.X.release]`` (or of the part that ``--only`` selectors name), each with its inputs hash
(kforge.buildinputs) and a compile-time estimate from the project's measured job profile ("unknown" where
nothing was measured). :func:`run_release` acts on it: builds what is not published through the normal
pipeline into one wheelhouse, optionally runs each wheel's GPU tests (kforge.gputest), then writes
``<wheelhouse>/releases/<project>.json`` (every wheel: target, variant, sha256, doctor verdict, build and step
times, GPU test outcome). A failed build stops the release before any manifest is written; the wheels published
before it stay (each published atomically) and the next run skips them. Failed GPU tests do not stop it: the
manifest records them and the command exits non-zero.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kforge import buildinputs
from kforge.build import jobs, profiles
from kforge.build.host import HostFacts
from kforge.config.model import Forge
from kforge.config.options import PlanOptions
from kforge.config.releasematrix import expand, parse_selector, select
from kforge.config.source import GitSource, SdistSource
from kforge.config.targets import make_target
from kforge.errors import ConfigError, KforgeError, PublishError
from kforge.fsutil import atomic_write_text, work_root
from kforge.gputest import GpuTestOutcome
from kforge.pipeline import BuildOutcome, Run, run_build
from kforge.plan import Plan, make_plan, profile_name
from kforge.platformfloor import parse_glibc, release_route
from kforge.sources import upstream as sources
from kforge.wheels import wheelhouse

RELEASES_DIR = "releases"


@dataclass(frozen=True)
class MatrixBuild:
    """One build of the whole matrix, selected or not: its ``--only`` key, target id and variant id."""

    key: str  # sm_90/cu130-torch2.11-cp312
    target: str
    variant: str
    selected: bool


@dataclass(frozen=True)
class ReleaseItem:
    plan: Plan
    inputs_hash: str | None  # None: the source is dirty, nothing can be compared
    estimate_s: float | None  # compile time from the measured profile; None: nothing measured
    estimate_note: str
    published: wheelhouse.PublishedWheel | None  # already published with these inputs: skipped
    key: str = ""  # the build's --only key: sm_90/cu130-torch2.11-cp312

    @property
    def variant(self) -> str:
        return self.plan.variant.id if self.plan.variant else ""

    def provisioning_summary(self) -> str:
        """``present`` when this interpreter and toolkit have every part, else ``provision`` and what."""
        prov = self.plan.provisioning
        if prov is None:
            return "present"
        missing = [f"{p.name} {p.want}" for p in prov.parts if not p.present]
        return "present" if not missing else "provision " + ", ".join(missing)


@dataclass(frozen=True)
class ReleasePlan:
    project: str
    platform: str
    wheelhouse: Path
    items: tuple[ReleaseItem, ...]  # the selected builds (all of the matrix without --only)
    matrix: tuple[MatrixBuild, ...] = ()  # every build of the matrix, selected or not
    selection: tuple[str, ...] = ()  # the --only selectors as given; () = the whole matrix
    route: str = ""  # how the builds reach the project's platform floor (kforge.platformfloor.release_route)

    @property
    def to_build(self) -> tuple[ReleaseItem, ...]:
        return tuple(i for i in self.items if i.published is None)

    def cost(self) -> str:
        todo = self.to_build
        if not todo:
            return "nothing to build"
        known = [i.estimate_s for i in todo if i.estimate_s is not None]
        unknown = len(todo) - len(known)
        if not known:
            return "unknown (nothing measured yet for these builds)"
        text = f"about {_duration(sum(known))} of compiling"
        return text + (f", plus {unknown} build{'s' if unknown > 1 else ''} with nothing measured (unknown)"
                       if unknown else "")

    def render(self) -> str:
        picked = (f" (--only {' --only '.join(self.selection)}: {len(self.items)} of the matrix's {len(self.matrix)})"
                  if self.selection else "")
        n_builds = f"{len(self.items)} build{'' if len(self.items) == 1 else 's'}"
        lines = [f"release {self.project}: {n_builds} for {self.platform} into {self.wheelhouse}{picked}",
                 *([f"  platform floor: {self.route}"] if self.route else []),
                 f"  {'#':>2}  {'target':24} {'variant':24} {'status':10} {'toolchain':10} estimate"]
        for n, item in enumerate(self.items, 1):
            status = "published" if item.published else "build"
            est = (f"skip: {item.published.filename}" if item.published else
                   (_duration(item.estimate_s) if item.estimate_s is not None else "unknown") + f" ({item.estimate_note})")
            summary = item.provisioning_summary()
            lines.append(f"  {n:>2}  {item.plan.id:24} {item.variant:24} {status:10} {summary.split()[0]:10} {est}")
            if summary != "present":
                lines.append(f"      {'':24} {summary}")
        lines.append(f"  {len(self.to_build)} to build, {len(self.items) - len(self.to_build)} already published "
                     f"with identical inputs; cost: {self.cost()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "platform": self.platform, "wheelhouse": str(self.wheelhouse),
                "cost": self.cost(), "selection": list(self.selection), "route": self.route,
                "matrix": [{"build": m.key, "target": m.target, "variant": m.variant, "selected": m.selected}
                           for m in self.matrix],
                "builds": [{"build": i.key, "target": i.plan.id, "arch": [a.sm for a in i.plan.archs], "variant": i.variant,
                            "toolchain": i.provisioning_summary(),
                            "local_version": i.plan.local_version,
                            "provisioning": i.plan.provisioning.to_dict() if i.plan.provisioning else None,
                            "inputs_hash": i.inputs_hash, "estimate_s": i.estimate_s, "estimate_note": i.estimate_note,
                            "published": i.published.filename if i.published else None} for i in self.items]}


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def source_identity(plan: Plan, cache_dir: Path) -> str:
    """What the pipeline's source step will record as the pin: commit, sdist sha256, or a local tree's hash."""
    src = plan.source
    if isinstance(src, GitSource):
        return src.commit
    if isinstance(src, SdistSource):
        return src.sha256
    scratch_parent = work_root(plan.root)
    scratch_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch_parent, prefix=".release-") as tmp:
        return sources.prepare(plan.root, src, Path(tmp) / "src", cache_dir=cache_dir).pin


def estimate(plan: Plan, cache_dir: Path) -> tuple[float | None, str]:
    """Compile seconds from the project's measured unit times (kforge.build.jobs), or None where nothing was measured."""
    profile = profiles.load_profile(cache_dir, plan.project.name, len(plan.archs), plan.profile)
    if profile.source.startswith("seed"):
        return None, f"nothing measured here; the {profile.source.split(':', 1)[1].strip()} seed is another machine's"
    if not profile.source.startswith("measured"):
        return None, "nothing measured"
    if profile.unit_builds and plan.jobs.predicted_seconds is not None and plan.jobs.order:
        return plan.jobs.predicted_seconds, (f"longest-first schedule of {len(plan.jobs.order)} measured units, "
                                             f"{plan.jobs.max_jobs} jobs x {plan.jobs.nvcc_threads} threads")
    builds = max(1, len(profile.history))
    units = plan.project.units(plan.profile) or max(1, round(profile.samples / builds))
    seconds = math.ceil(units / plan.jobs.max_jobs) * jobs.unit_seconds(profile, plan.jobs.nvcc_threads)
    return seconds, f"{units} units x {jobs.unit_seconds(profile, plan.jobs.nvcc_threads):.0f} s, {plan.jobs.max_jobs} jobs"


def plan_release(forge: Forge, project_name: str, host: HostFacts, options: PlanOptions, *, cache_dir: Path,
                 wheelhouse_root: Path, only: Sequence[str] = (), image_tools: bool | None = None) -> ReleasePlan:
    """Plan every build of the project's release matrix, or those ``only`` selects (raises before anything runs).

    On a host whose glibc is newer than the project's platform floor, the builds go through kforge's older
    image (kforge.platformfloor.release_route; ``image_tools``: podman and debootstrap are here, None: look).
    """
    project = forge.project(project_name)
    if project.release is None:
        raise ConfigError(f"{project.name} declares no release matrix",
                          fix=f"add a [projects.{project.name}.release] table to forge.toml (archs, variants; "
                              "see docs/forge-toml.md)")
    if host.platform not in project.platforms:
        raise ConfigError(f"{project.name} does not build for this host's platform {host.platform}",
                          fix=f"cut the release on one of: {', '.join(project.platforms)}")
    for name in ("cuda", "torch", "python"):
        if getattr(options, name) is not None:
            raise ConfigError(f"--{name} (or KFORGE_{name.upper()}) does not apply to a release: its variants come from "
                              f"[projects.{project.name}.release]", fix=f"drop --{name}, or edit the release matrix")
    if image_tools is None:
        image_tools = all(shutil.which(t) for t in ("podman", "debootstrap"))
    route = release_route(project.name, options.platform_tag or project.platform_tag,
                          platform_os=forge.platforms[host.platform].os, host_glibc=parse_glibc(host.glibc),
                          backend=options.backend or project.backend, backend_chosen=options.backend is not None,
                          image=options.image, image_tools=image_tools)
    if route.backend:
        options = replace(options, backend=route.backend, image=route.image)
    selectors = [parse_selector(text, tuple(project.arch_sets)) for text in only]
    builds = expand(project.release, host.python)
    chosen = select(builds, selectors, project.name)
    targets = {b: make_target(forge, project, b.archs, host.platform, host.platform, arch_set=b.entry.arch_set)
               for b in builds}
    matrix = tuple(MatrixBuild(b.key, targets[b].id, b.variant.id, b in chosen) for b in builds)
    published = wheelhouse.list_wheels(wheelhouse_root, project.name)
    identities: dict[str, str] = {}
    items = []
    for build in chosen:
        target = targets[build]
        v = build.variant
        opts = replace(options, cuda=f"{v.cuda.major}.{v.cuda.minor}", cuda_from="the release matrix",
                       torch=str(v.torch) if v.torch is not None else None, python=v.python)
        plan = make_plan(forge, target, host, opts, job_profile=profiles.load_profile(
            cache_dir, project.name, 1, profile_name(project, opts.profile)))
        key = repr(plan.source)
        if key not in identities:
            identities[key] = source_identity(plan, cache_dir)
        digest = buildinputs.inputs_hash(plan, identities[key])
        seconds, note = estimate(plan, cache_dir)
        done = next((w for w in published if w.record.inputs_hash == digest and w.record.target == plan.id), None)
        items.append(ReleaseItem(plan, digest, seconds, note, done, build.key))
    _check_names_differ(project.name, project.torch_abi, items)
    return ReleasePlan(project.name, host.platform, Path(wheelhouse_root), tuple(items), matrix,
                       tuple(s.text for s in selectors), route.note)


def _check_names_differ(project: str, torch_abi: bool, items: list[ReleaseItem]) -> None:
    """Two builds whose wheels would get the same file name would replace each other in the index.

    A wheel's name is the project's, its version with the local label, and its tags. A torch-ABI wheel's label
    carries CUDA and torch and its tag the Python; a torch-free wheel's label names only its archs and its tag
    may be ``py3-none``: two of its variants would collide. Two entries with the same archs (``sm_90a`` and an
    arch set of just sm_90a) get the same label too.
    """
    seen: dict[tuple[str | None, str], ReleaseItem] = {}
    for item in items:
        key = (item.plan.local_version, item.plan.toolchain.python if torch_abi else "")
        if key in seen:
            first = seen[key]
            same_build = first.plan.id == item.plan.id
            raise ConfigError(
                f"the release matrix of {project} has {first.key} and {item.key}, and both wheels would get the same "
                f"file name (local version label {item.plan.local_version or 'none'})",
                why=("a torch-free wheel's name has no CUDA or Python part (its label names its archs only)" if same_build
                     else f"{first.plan.id} and {item.plan.id} compile the same archs"),
                fix=(f"keep one variant per arch in [projects.{project}.release], or exclude one of them" if same_build
                     else f"list those archs once in [projects.{project}.release] archs"))
        seen[key] = item


@dataclass(frozen=True)
class BuildTimes:
    """One build's wall time and its steps' (the pipeline's log timings), in step order."""

    key: str
    seconds: float
    steps: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class WheelGpuTests:
    """The GPU test outcome of one wheel of the release."""

    wheel: str  # the wheel's file name
    outcome: GpuTestOutcome

    @property
    def ok(self) -> bool:
        return self.outcome.status in ("passed", "skipped")


#: ``gpu_test(item, wheel)``: run the wheel's GPU tests (kforge.gputest), or raise a KforgeError.
GpuTest = Callable[[ReleaseItem, wheelhouse.PublishedWheel], GpuTestOutcome]


@dataclass(frozen=True)
class ReleaseResult:
    plan: ReleasePlan
    built: tuple[BuildOutcome, ...]
    manifest: Path
    times: tuple[BuildTimes, ...] = ()
    gpu_tests: tuple[WheelGpuTests, ...] = ()  # empty: not asked for

    @property
    def gpu_failures(self) -> tuple[WheelGpuTests, ...]:
        return tuple(g for g in self.gpu_tests if not g.ok)


def run_release(rplan: ReleasePlan, make_run: Callable[[Plan, int], Run], *,
                say: Callable[[str], None] = print, gpu_test: GpuTest | None = None) -> ReleaseResult:
    """Build what is not published, one build at a time, run the GPU tests if asked, then write the manifest.

    ``make_run(plan, n)`` gives the n-th build's :class:`~kforge.pipeline.Run` (its log, its services).
    ``gpu_test`` runs one wheel's GPU tests; every wheel of the selection is tested, built now or skipped.
    """
    built: list[BuildOutcome] = []
    times: list[BuildTimes] = []
    todo = rplan.to_build
    for n, item in enumerate(todo, 1):
        say(f"release {rplan.project}: build {n}/{len(todo)}: {item.plan.id} {item.variant}")
        run = make_run(item.plan, n)
        try:
            outcome = run_build(item.plan, run)
        except KforgeError as exc:
            done = ", ".join(f"{i.plan.id} ({i.variant})" for i in todo[:n - 1]) or "none"
            exc.why = ((exc.why + "; ") if exc.why else "") + (
                f"release {rplan.project} stopped at {item.plan.id} ({item.variant}); built before it: {done}; "
                "no release manifest was written")
            exc.fix = (exc.fix + "; " if exc.fix else "") + f"then run `kforge release {rplan.project}` again: it skips what is published"
            raise
        built.append(outcome)
        times.append(BuildTimes(item.key, round(outcome.seconds, 1),
                                tuple((name, round(sec, 1)) for name, sec in run.log.timings.items())))
    gpu: list[WheelGpuTests] = []
    if gpu_test is not None:
        wheels = [(item, w) for item in rplan.items for w in _published(rplan, item)]
        for n, (item, w) in enumerate(wheels, 1):
            say(f"release {rplan.project}: GPU tests {n}/{len(wheels)}: {w.filename}")
            try:
                result = gpu_test(item, w)
            except KforgeError as exc:
                result = GpuTestOutcome("error", exc.what + (f" ({exc.why})" if exc.why else ""), w.wheel)
            say(f"release {rplan.project}: GPU tests of {w.filename}: {result.status}"
                + (f" ({result.reason})" if result.reason else ""))
            gpu.append(WheelGpuTests(w.filename, result))
    manifest = write_manifest(rplan, times=tuple(times), gpu_tests=tuple(gpu) if gpu_test is not None else None)
    return ReleaseResult(rplan, tuple(built), manifest, tuple(times), tuple(gpu))


def variant_problem(item: ReleaseItem) -> str | None:
    """Why this interpreter can't import the item's wheel (another Python or torch), or None when it can."""
    prov = item.plan.provisioning
    if prov is None:
        return None
    other = [f"{p.name} {p.want}" for p in prov.parts if p.name in ("python", "torch") and not p.present]
    if not other:
        return None
    return (f"variant {item.variant} needs {', '.join(other)}, which this interpreter does not have: its GPU tests "
            "run where the variant is the host's (cut that part with --only on such a machine)")


def _published(rplan: ReleasePlan, item: ReleaseItem,
               wheels: Sequence[wheelhouse.PublishedWheel] | None = None) -> list[wheelhouse.PublishedWheel]:
    """The item's published wheels (same target, same inputs hash)."""
    wheels = wheelhouse.list_wheels(rplan.wheelhouse, rplan.project) if wheels is None else wheels
    return [w for w in wheels if w.record.inputs_hash == item.inputs_hash and w.record.target == item.plan.id]


def manifest_entries(rplan: ReleasePlan, *, times: Sequence[BuildTimes] = (),
                     gpu_tests: Sequence[WheelGpuTests] | None = None) -> list[dict[str, Any]]:
    """Every wheel of the selection as published now: build, target, variant, sha256, doctor verdict, build time
    (and each step's, for builds of this run), GPU test outcome."""
    wheels = wheelhouse.list_wheels(rplan.wheelhouse, rplan.project)
    by_key = {t.key: t for t in times}
    gpu = {g.wheel: g.outcome for g in gpu_tests or ()}
    out = []
    for item in rplan.items:
        match = _published(rplan, item, wheels)
        if not match:
            raise PublishError(f"release {rplan.project}: {item.plan.id} ({item.variant}) has no published wheel with its inputs",
                              why="a build of the release did not publish, or another process replaced its wheel",
                              fix=f"run `kforge release {rplan.project}` again")
        t = by_key.get(item.key)
        for w in match:
            doctor: Mapping[str, Any] = w.record.doctor or {}
            tested = gpu.get(w.filename)
            out.append({"build": item.key, "target": item.plan.id, "variant": item.variant, "arch": list(w.record.archs),
                        "wheel": f"{w.project}/{w.filename}", "sha256": w.sha256, "size": w.record.size,
                        "inputs_hash": w.record.inputs_hash,
                        "doctor": "ok" if doctor.get("ok") else ("failed" if doctor.get("ok") is False else "unknown"),
                        "findings": [f.get("message", str(f)) if isinstance(f, dict) else str(f)
                                     for f in doctor.get("findings", [])],
                        "gpu_tests": tested.to_dict() if tested else
                        {"status": "not run", "reason": "kforge release ran without --gpu-tests" if gpu_tests is None
                         else "not tested"},
                        "built_at": w.record.built_at, "build_seconds": w.record.build_seconds,
                        "wall_seconds": t.seconds if t else None,
                        "steps": dict(t.steps) if t else None,
                        "skipped": item.published is not None})
    return out


def write_manifest(rplan: ReleasePlan, *, times: Sequence[BuildTimes] = (),
                   gpu_tests: Sequence[WheelGpuTests] | None = None) -> Path:
    """``<wheelhouse>/releases/<project>.json``, written atomically.

    A run of part of the matrix (``--only``) keeps the earlier manifest's entries for the builds it did not
    select, as long as their wheel is still published with the recorded sha256; so the file always describes
    the release as published, never only the last run's part.
    """
    path = rplan.wheelhouse / RELEASES_DIR / f"{rplan.project}.json"
    entries = manifest_entries(rplan, times=times, gpu_tests=gpu_tests)
    entries += _kept_entries(rplan, path, {(e["target"], e["variant"]) for e in entries})
    order = {(m.target, m.variant): n for n, m in enumerate(rplan.matrix)}
    entries.sort(key=lambda e: order.get((e["target"], e["variant"]), len(order)))
    listed = {(e["target"], e["variant"]) for e in entries}
    data = {"project": rplan.project, "platform": rplan.platform,
            "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "index": "simple/", "selection": list(rplan.selection),
            "complete": all((m.target, m.variant) in listed for m in rplan.matrix),
            "missing": [m.key for m in rplan.matrix if (m.target, m.variant) not in listed],
            "wheels": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return path


def _kept_entries(rplan: ReleasePlan, path: Path, fresh: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The earlier manifest's entries for matrix builds this run did not select, still published as recorded."""
    if not rplan.selection or not path.is_file():
        return []
    try:
        old = json.loads(path.read_text())
        entries = [e for e in old.get("wheels", []) if isinstance(e, dict)]
    except (OSError, ValueError, AttributeError):
        return []  # an unreadable manifest is replaced, not merged
    in_matrix = {(m.target, m.variant) for m in rplan.matrix if not m.selected}
    published = {(f"{w.project}/{w.filename}", w.sha256) for w in wheelhouse.list_wheels(rplan.wheelhouse, rplan.project)}
    return [e for e in entries if (e.get("target"), e.get("variant")) in in_matrix
            and (e.get("target"), e.get("variant")) not in fresh and (e.get("wheel"), e.get("sha256")) in published]
