"""``test-<target>``: install the target's wheel from the wheelhouse index and run its GPU tests.

The wheel comes from the generated PEP 503 index through real pip, into the interpreter that runs
kforge (the nox session's fresh venv, which sees the machine's torch). Run outside nox, it installs
into whatever interpreter runs kforge: that is why the README sends users through ``nox -s test-<target>``. Without a GPU, or when the
GPU's arch is not in the wheel (judged by the doctor on the wheel itself), the tests are skipped with
the reason, or fail instead when ``KFORGE_REQUIRE_GPU=1``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from kforge import doctor, patches, sources, wheelhouse
from kforge.config import Forge
from kforge.errors import ConfigError, GPUError, GpuTestError, PublishError
from kforge.host import HostFacts
from kforge.log import StepLog
from kforge.plan import Plan
from kforge.series import load_series


@dataclass(frozen=True)
class GpuTestOutcome:
    status: str  # "passed" | "skipped"
    reason: str
    wheel: Path | None = None


def latest_wheel(wheelhouse_root: Path, plan: Plan) -> wheelhouse.PublishedWheel:
    """The newest complete wheel published for this target."""
    mine = [w for w in wheelhouse.list_wheels(wheelhouse_root, plan.project.name)
            if w.record.target == plan.id and w.record.host.get("platform", plan.target.platform) == plan.target.platform]
    if not mine:
        raise PublishError(
            f"no wheel for {plan.id} in {wheelhouse_root}",
            fix=f"build it first: nox -s build-{plan.id} (or kforge build {plan.id})",
        )
    return max(mine, key=lambda w: w.record.built_at or "")


def gpu_problem(host: HostFacts, wheel: Path) -> str | None:
    """Why this machine's GPU can't run the wheel, or None when it can."""
    if host.gpu_arch is None:
        if host.gpu_name:
            return f"this machine's GPU, {host.gpu_name}, is not one the wheel can target"
        return "no NVIDIA GPU on this machine (nvidia-smi found none)"
    want = host.gpu_arch.base.sm
    findings = doctor.check(doctor.inspect_wheel(wheel), expect_archs=[want])
    errors = [f for f in findings if f.is_error and f.arch == want]
    if errors:
        return f"this machine's GPU ({host.gpu_name or want}, {want}) cannot run the wheel: {errors[0].message}"
    return None


def run_gpu_tests(
    forge: Forge,
    plan: Plan,
    host: HostFacts,
    *,
    wheelhouse_root: Path,
    environ: Mapping[str, str],
    python: str = sys.executable,
    log: StepLog | None = None,
) -> GpuTestOutcome:
    log = log or StepLog(total=3, title=f"test-{plan.id}")
    if plan.gpu_tests is None:
        raise ConfigError(f"{plan.project.name} declares no GPU tests", fix=f"add gpu_tests = {{ paths = [...] }} to projects.{plan.project.name}")
    published = latest_wheel(wheelhouse_root, plan)
    problem = gpu_problem(host, published.wheel)
    if problem:
        if environ.get("KFORGE_REQUIRE_GPU") == "1":
            raise GPUError(problem, why="KFORGE_REQUIRE_GPU=1 turns a skip into a failure",
                           fix="run this on a machine whose GPU is one of the wheel's archs, or unset KFORGE_REQUIRE_GPU")
        log.warning(f"skipped: {problem}")
        return GpuTestOutcome("skipped", problem, published.wheel)

    name, version, _, _ = parse_wheel_filename(published.wheel.name)
    index = (Path(wheelhouse_root) / "simple").resolve().as_uri()
    with log.step("install", f"{name}=={version} from {index}"):
        _run([python, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir",
              "--index-url", index, f"{name}=={version}"], environ, "pip install from the wheelhouse index")

    work = forge.root / ".kforge" / "work" / f"test-{plan.id}"
    with log.step("source", "the project's tests"):
        tree, applied = prepare_test_tree(forge, plan, work / "src", cache_dir=_cache(environ))
        if applied:
            log.info(f"patched the test tree: {', '.join(applied)}")
        paths = [str(tree / p) for p in plan.gpu_tests.paths]

    with log.step("pytest", " ".join(plan.gpu_tests.paths)):
        # Run from the work dir, not the source tree, so the installed wheel is imported, not the sources.
        code = subprocess.call([python, "-m", "pytest", *paths, *plan.gpu_tests.args, "-p", "no:cacheprovider"],
                               cwd=work, env=pytest_environment(environ, plan))
        if code != 0:
            raise GpuTestError(f"the GPU tests of {plan.id} failed (pytest exit code {code})",
                             why="pytest exits 5 when it collected no tests" if code == 5 else None,
                             fix="read the pytest output above")
    return GpuTestOutcome("passed", "", published.wheel)


def prepare_test_tree(forge: Forge, plan: Plan, dest: Path, *, cache_dir: Path) -> tuple[Path, tuple[str, ...]]:
    """A fresh copy of the project's source with the plan's patches applied: the tests run on the tree
    the wheel was built from (a series may add a curated smoke-test file, as FlashMLA's and FA3's do)."""
    prepared = sources.prepare(forge.root, plan.project.source, dest, cache_dir=cache_dir, allow_dirty=True,
                               name=plan.project.name)
    applied = patches.apply(prepared.tree, load_series(plan.project.patches), plan.patch_context)
    return prepared.tree, applied.applied


def pytest_environment(environ: Mapping[str, str], plan: Plan) -> dict[str, str]:
    """The tests see the build's knobs: FA3's hopper tests read FLASH_ATTENTION_DISABLE_* to know which
    kernels the wheel has (a profile that prunes them would otherwise fail its tests)."""
    return {**environ, **plan.env}


def _cache(environ: Mapping[str, str]) -> Path:
    from kforge.commands._common import cache_dir

    return cache_dir(environ)


def _run(cmd: list[str], environ: Mapping[str, str], what: str) -> None:
    proc = subprocess.run(cmd, env=dict(environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise GpuTestError(f"{what} failed: {' '.join(cmd)} exited {proc.returncode}", why=tail,
                           fix="check that the wheelhouse index lists the wheel (kforge wheelhouse index)")
