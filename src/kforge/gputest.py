"""Test a target's published wheel on this GPU: pip install it from the wheelhouse index, run its GPU tests.

The wheel comes from the generated PEP 503 index through real pip, into the interpreter that runs
kforge (the nox session's fresh venv, which sees the machine's torch). Run outside nox, it installs
into whatever interpreter runs kforge: that is why the README sends users through ``nox -s test-<target>``. Without a GPU, or when the
GPU's arch is not in the wheel (judged by the doctor on the wheel itself), the tests are skipped with
the reason, or fail instead when ``KFORGE_REQUIRE_GPU=1``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

from packaging.utils import parse_wheel_filename

from kforge import doctor
from kforge.build.host import HostFacts
from kforge.errors import ConfigError, GPUError, GpuTestError, PublishError
from kforge.fsutil import cache_dir, work_root
from kforge.log import StepLog
from kforge.plan import Plan
from kforge.sources import patches
from kforge.sources import upstream as sources
from kforge.wheels import wheelhouse


@dataclass(frozen=True)
class PytestCounts:
    """pytest's tally from its JUnit XML report: what passed, failed, errored and was skipped."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"passed": self.passed, "failed": self.failed, "errors": self.errors, "skipped": self.skipped}


@dataclass(frozen=True)
class GpuTestOutcome:
    status: str  # "passed" | "failed" (only with check=False) | "skipped"
    reason: str
    wheel: Path | None = None
    counts: PytestCounts | None = None  # None: pytest did not run (skipped) or wrote no report

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "reason": self.reason,
                **(self.counts.to_dict() if self.counts else {"passed": None, "failed": None, "errors": None,
                                                              "skipped": None})}


def read_junit(path: Path) -> PytestCounts | None:
    """Sum the ``<testsuite>`` counts of a pytest ``--junitxml`` report; None when there is none or it is unreadable."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = failed = errors = skipped = 0
    try:
        for suite in suites:
            tests += int(suite.get("tests", 0))
            failed += int(suite.get("failures", 0))
            errors += int(suite.get("errors", 0))
            skipped += int(suite.get("skipped", 0))
    except ValueError:  # a malformed count: no numbers rather than wrong ones
        return None
    return PytestCounts(passed=tests - failed - errors - skipped, failed=failed, errors=errors, skipped=skipped)


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


def gpu_problem(host: HostFacts, wheel: Path,
                inspect_wheel: Callable[[Path], doctor.WheelReport] = doctor.inspect_wheel) -> str | None:
    """Why this machine's GPU can't run the wheel, or None when it can."""
    if host.gpu_arch is None:
        if host.gpu_name:
            return f"this machine's GPU, {host.gpu_name}, is not one the wheel can target"
        return "no NVIDIA GPU on this machine (nvidia-smi found none)"
    want = host.gpu_arch.base.sm
    findings = doctor.check(inspect_wheel(wheel), expect_archs=[want])
    errors = [f for f in findings if f.is_error and f.arch == want]
    if errors:
        return f"this machine's GPU ({host.gpu_name or want}, {want}) cannot run the wheel: {errors[0].message}"
    return None


def skip_or_fail(problem: str, environ: Mapping[str, str]) -> None:
    """The GPU rule: a problem skips the tests, or fails them when ``KFORGE_REQUIRE_GPU=1``."""
    if environ.get("KFORGE_REQUIRE_GPU") == "1":
        raise GPUError(problem, why="KFORGE_REQUIRE_GPU=1 turns a skip into a failure",
                       fix="run this on a machine whose GPU is one of the wheel's archs, or unset KFORGE_REQUIRE_GPU")


def run_command(cmd: Sequence[str], environ: Mapping[str, str], *, cwd: Path | None = None,
                capture: bool = False) -> tuple[int, str]:
    """Run a command (its output captured, or straight to the console); its exit code and captured output."""
    if not capture:
        return subprocess.call(list(cmd), cwd=cwd, env=dict(environ)), ""
    proc = subprocess.run(list(cmd), env=dict(environ), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    return proc.returncode, proc.stdout


Runner = Callable[..., "tuple[int, str]"]


def run_gpu_tests(
    plan: Plan,
    host: HostFacts,
    *,
    wheelhouse_root: Path,
    environ: Mapping[str, str],
    python: str = sys.executable,
    log: StepLog | None = None,
    runner: Runner = run_command,
    inspect_wheel: Callable[[Path], doctor.WheelReport] = doctor.inspect_wheel,
    published: wheelhouse.PublishedWheel | None = None,
    check: bool = True,
) -> GpuTestOutcome:
    """Install the target's newest published wheel (or ``published``) from the wheelhouse index and run its GPU
    tests. Failed tests raise GpuTestError, or with ``check=False`` give a "failed" outcome with the counts."""
    log = log or StepLog(total=3, title=f"test-{plan.id}")
    if plan.gpu_tests is None:
        raise ConfigError(f"{plan.project.name} declares no GPU tests", fix=f"add gpu_tests = {{ paths = [...] }} to projects.{plan.project.name}")
    published = published or latest_wheel(wheelhouse_root, plan)
    problem = gpu_problem(host, published.wheel, inspect_wheel)
    if problem:
        skip_or_fail(problem, environ)
        log.warning(f"skipped: {problem}")
        return GpuTestOutcome("skipped", problem, published.wheel)
    with log.step("install", f"from {wheelhouse_root / 'simple'}"):
        _install(published.wheel, wheelhouse_root, python, environ, runner)
    work = work_root(plan.root) / f"test-{plan.id}"
    with log.step("source", "the project's tests"):
        tree, applied = prepare_test_tree(plan, work / "src", cache_dir=cache_dir(environ))
        if applied:
            log.info(f"patched the test tree: {', '.join(applied)}")
    with log.step("pytest", " ".join(plan.gpu_tests.paths)):
        # Run from the work dir, not the source tree, so the installed wheel is imported, not the sources.
        paths = [str(tree / p) for p in plan.gpu_tests.paths]
        junit = work / "junit.xml"
        junit.unlink(missing_ok=True)
        code, _ = runner([python, "-m", "pytest", *paths, *plan.gpu_tests.args, "-p", "no:cacheprovider",
                          f"--junitxml={junit}"], pytest_environment(environ, plan), cwd=work)
        counts = read_junit(junit)
        if code != 0:
            if not check:
                return GpuTestOutcome("failed", f"pytest exit code {code}", published.wheel, counts)
            raise GpuTestError(f"the GPU tests of {plan.id} failed (pytest exit code {code})",
                               why="pytest exits 5 when it collected no tests" if code == 5 else None,
                               fix="read the pytest output above")
    if counts is not None and counts.passed == 0:
        # pytest exits 0 when every test skipped (another GPU, a narrowed selection): that is not a pass.
        why = f"pytest ran no test to a pass ({counts.skipped} skipped)"
        skip_or_fail(why, environ)
        return GpuTestOutcome("skipped", why, published.wheel, counts)
    return GpuTestOutcome("passed", "", published.wheel, counts)


def prepare_test_tree(plan: Plan, dest: Path, *, cache_dir: Path) -> tuple[Path, tuple[str, ...]]:
    """A fresh copy of the project's source with the plan's patches applied: the tests run on the tree
    the wheel was built from (a series may add a curated smoke-test file, as FlashMLA's and FA3's do)."""
    prepared = sources.prepare(plan.root, plan.source, dest, cache_dir=cache_dir, allow_dirty=True,
                               name=plan.project.name)
    applied = patches.apply(prepared.tree, plan.series, plan.patch_context)
    return prepared.tree, applied.applied


def pytest_environment(environ: Mapping[str, str], plan: Plan) -> dict[str, str]:
    """The tests see the build's knobs: FA3's hopper tests read FLASH_ATTENTION_DISABLE_* to know which
    kernels the wheel has (a profile that prunes them would otherwise fail its tests)."""
    return {**environ, **plan.env}


def _install(wheel: Path, wheelhouse_root: Path, python: str, environ: Mapping[str, str], runner: Runner) -> None:
    """pip install the wheel by name and version from the wheelhouse's PEP 503 index (as a user would)."""
    name, version, _, _ = parse_wheel_filename(wheel.name)
    index = (Path(wheelhouse_root) / "simple").resolve().as_uri()
    cmd = [python, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir",
           "--index-url", index, f"{name}=={version}"]
    code, output = runner(cmd, environ, capture=True)
    if code != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise GpuTestError(f"pip install from the wheelhouse index failed: {' '.join(cmd)} exited {code}", why=tail,
                           fix="check that the wheelhouse index lists the wheel (kforge wheelhouse index)")
