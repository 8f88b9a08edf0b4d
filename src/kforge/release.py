"""Cut a release: plan every build of a project's release matrix, price it, skip what is already published with
identical inputs, build the rest one after another (one job budget, one compiler cache), write the release manifest.

:func:`plan_release` is the analysis: one complete :class:`~kforge.plan.Plan` per (arch, variant) of
``[projects.X.release]``, each with its inputs hash (kforge.buildinputs) and a compile-time estimate from the
project's measured job profile ("unknown" where nothing was measured). :func:`run_release` acts on it: builds
what is not published through the normal pipeline into one wheelhouse, then writes
``<wheelhouse>/releases/<project>.json`` (every wheel: target, variant, sha256, doctor verdict). A failed build
stops the release before any manifest is written; the wheels published before it stay (each published
atomically) and the next run skips them.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kforge import buildinputs, jobs, sources, wheelhouse
from kforge.config import Forge
from kforge.errors import ConfigError, KforgeError, PublishError
from kforge.fsutil import atomic_write_text, work_root
from kforge.host import HostFacts
from kforge.options import PlanOptions
from kforge.pipeline import BuildOutcome, Run, run_build
from kforge.plan import Plan, make_plan
from kforge.releasematrix import expand
from kforge.sources import GitSource, SdistSource
from kforge.targets import make_target

RELEASES_DIR = "releases"


@dataclass(frozen=True)
class ReleaseItem:
    plan: Plan
    inputs_hash: str | None  # None: the source is dirty, nothing can be compared
    estimate_s: float | None  # compile time from the measured profile; None: nothing measured
    estimate_note: str
    published: wheelhouse.PublishedWheel | None  # already published with these inputs: skipped

    @property
    def variant(self) -> str:
        return self.plan.variant.id if self.plan.variant else ""


@dataclass(frozen=True)
class ReleasePlan:
    project: str
    platform: str
    wheelhouse: Path
    items: tuple[ReleaseItem, ...]

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
        lines = [f"release {self.project}: {len(self.items)} builds for {self.platform} into {self.wheelhouse}",
                 f"  {'#':>2}  {'target':24} {'variant':24} {'status':10} estimate"]
        for n, item in enumerate(self.items, 1):
            status = "published" if item.published else "build"
            est = (f"skip: {item.published.filename}" if item.published else
                   (_duration(item.estimate_s) if item.estimate_s is not None else "unknown") + f" ({item.estimate_note})")
            lines.append(f"  {n:>2}  {item.plan.id:24} {item.variant:24} {status:10} {est}")
        lines.append(f"  {len(self.to_build)} to build, {len(self.items) - len(self.to_build)} already published "
                     f"with identical inputs; cost: {self.cost()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "platform": self.platform, "wheelhouse": str(self.wheelhouse),
                "cost": self.cost(),
                "builds": [{"target": i.plan.id, "arch": [a.sm for a in i.plan.archs], "variant": i.variant,
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
    """Compile seconds from the project's measured unit times (kforge.jobs), or None where nothing was measured."""
    profile = jobs.load_profile(cache_dir, plan.project.name, len(plan.archs))
    if profile.source.startswith("seed"):
        return None, f"nothing measured here; the {profile.source.split(':', 1)[1].strip()} seed is another machine's"
    if not profile.source.startswith("measured"):
        return None, "nothing measured"
    builds = max(1, len(profile.history))
    units = plan.project.compile_units or max(1, round(profile.samples / builds))
    seconds = math.ceil(units / plan.jobs.max_jobs) * jobs.unit_seconds(profile, plan.jobs.nvcc_threads)
    return seconds, f"{units} units x {jobs.unit_seconds(profile, plan.jobs.nvcc_threads):.0f} s, {plan.jobs.max_jobs} jobs"


def plan_release(forge: Forge, project_name: str, host: HostFacts, options: PlanOptions, *, cache_dir: Path,
                 wheelhouse_root: Path) -> ReleasePlan:
    """Plan every build of the project's release matrix (raises before anything runs)."""
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
    builds = expand(project.release, host.python)
    published = wheelhouse.list_wheels(wheelhouse_root, project.name)
    identities: dict[str, str] = {}
    items = []
    for build in builds:
        target = make_target(forge, project, build.arch, host.platform, host.platform)
        v = build.variant
        opts = replace(options, cuda=f"{v.cuda.major}.{v.cuda.minor}", cuda_from="the release matrix",
                       torch=str(v.torch) if v.torch is not None else None, python=v.python)
        plan = make_plan(forge, target, host, opts,
                         job_profile=jobs.load_profile(cache_dir, project.name, 1))
        key = repr(plan.source)
        if key not in identities:
            identities[key] = source_identity(plan, cache_dir)
        digest = buildinputs.inputs_hash(plan, identities[key])
        seconds, note = estimate(plan, cache_dir)
        done = next((w for w in published if w.record.inputs_hash == digest and w.record.target == plan.id), None)
        items.append(ReleaseItem(plan, digest, seconds, note, done))
    _check_names_differ(project.name, project.torch_abi, items)
    return ReleasePlan(project.name, host.platform, Path(wheelhouse_root), tuple(items))


def _check_names_differ(project: str, torch_abi: bool, items: list[ReleaseItem]) -> None:
    """Two builds whose wheels would get the same file name would replace each other in the index.

    A torch-ABI wheel's name carries CUDA and torch (its label) and the Python (its tag). A torch-free wheel's
    label names only its archs, and its tag may be ``py3-none``: two of its variants would collide.
    """
    seen: dict[tuple[str, str | None, str], ReleaseItem] = {}
    for item in items:
        key = (item.plan.id, item.plan.local_version, item.plan.toolchain.python if torch_abi else "")
        if key in seen:
            raise ConfigError(
                f"the release matrix of {project} has {seen[key].variant} and {item.variant} for {item.plan.id}, and "
                "both wheels would get the same file name",
                why="a torch-free wheel's name has no CUDA or Python part (its label names its archs only)",
                fix=f"keep one variant per arch in [projects.{project}.release], or exclude one of them")
        seen[key] = item


@dataclass(frozen=True)
class ReleaseResult:
    plan: ReleasePlan
    built: tuple[BuildOutcome, ...]
    manifest: Path


def run_release(rplan: ReleasePlan, make_run: Callable[[Plan, int], Run], *,
                say: Callable[[str], None] = print) -> ReleaseResult:
    """Build what is not published, one build at a time, then write the release manifest.

    ``make_run(plan, n)`` gives the n-th build's :class:`~kforge.pipeline.Run` (its log, its services).
    """
    built: list[BuildOutcome] = []
    todo = rplan.to_build
    for n, item in enumerate(todo, 1):
        say(f"release {rplan.project}: build {n}/{len(todo)}: {item.plan.id} {item.variant}")
        try:
            built.append(run_build(item.plan, make_run(item.plan, n)))
        except KforgeError as exc:
            done = ", ".join(f"{i.plan.id} ({i.variant})" for i in todo[:n - 1]) or "none"
            exc.why = ((exc.why + "; ") if exc.why else "") + (
                f"release {rplan.project} stopped at {item.plan.id} ({item.variant}); built before it: {done}; "
                "no release manifest was written")
            exc.fix = (exc.fix + "; " if exc.fix else "") + f"then run `kforge release {rplan.project}` again: it skips what is published"
            raise
    manifest = write_manifest(rplan)
    return ReleaseResult(rplan, tuple(built), manifest)


def manifest_entries(rplan: ReleasePlan) -> list[dict[str, Any]]:
    """Every wheel of the release as published now: target, variant, sha256, doctor verdict."""
    wheels = wheelhouse.list_wheels(rplan.wheelhouse, rplan.project)
    out = []
    for item in rplan.items:
        match = [w for w in wheels if w.record.inputs_hash == item.inputs_hash and w.record.target == item.plan.id]
        if not match:
            raise PublishError(f"release {rplan.project}: {item.plan.id} ({item.variant}) has no published wheel with its inputs",
                              why="a build of the release did not publish, or another process replaced its wheel",
                              fix=f"run `kforge release {rplan.project}` again")
        for w in match:
            doctor: Mapping[str, Any] = w.record.doctor or {}
            out.append({"target": item.plan.id, "variant": item.variant, "arch": list(w.record.archs),
                        "wheel": f"{w.project}/{w.filename}", "sha256": w.sha256, "size": w.record.size,
                        "inputs_hash": w.record.inputs_hash,
                        "doctor": "ok" if doctor.get("ok") else ("failed" if doctor.get("ok") is False else "unknown"),
                        "findings": [f.get("message", str(f)) if isinstance(f, dict) else str(f)
                                     for f in doctor.get("findings", [])],
                        "built_at": w.record.built_at, "skipped": item.published is not None})
    return out


def write_manifest(rplan: ReleasePlan) -> Path:
    """``<wheelhouse>/releases/<project>.json``, written atomically."""
    data = {"project": rplan.project, "platform": rplan.platform,
            "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "index": "simple/", "wheels": manifest_entries(rplan)}
    path = rplan.wheelhouse / RELEASES_DIR / f"{rplan.project}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return path
