"""The generated jobs run: fmha's build job and its GPU test job, executed step by step as a runner would.

Same job and step environment, same ``run:`` scripts in the same order under ``bash -eo pipefail``,
the same ``if:`` rules, ``GITHUB_ENV``/``GITHUB_PATH``/``GITHUB_STEP_SUMMARY`` files; the actions are
replaced by what they do here: checkout is a copy of this working tree (a fresh git repository),
setup-python a fresh venv, upload/download-artifact a copy through a folder, cache nothing. So a
step that is broken (a wrong command, a path that isn't there, a session that doesn't exist) fails
this test, not the first real run on a GPU runner.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kforge.build.host import detect_gpu
from kforge.ci.workflows import workflow_data
from kforge.config.forge import load_forge

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STEP_TIMEOUT = 1800


@dataclass
class Runner:
    """Just enough of a GitHub Actions runner to execute a generated job's steps, and nothing it doesn't use."""

    workspace: Path
    temp: Path
    python_bin: Path  # what setup-python put first on PATH
    artifacts: Path
    log: list[str] = field(default_factory=list)

    def expression(self, expr: str, status: str) -> Any:
        expr = expr.strip()
        known = {
            "always()": True,
            "success()": status == "success",
            "failure()": status == "failure",
            "runner.environment == 'github-hosted'": False,  # this machine stands in for a self-hosted runner
            "github.workspace": str(self.workspace),
            "job.status": status,
            "github.sha": "0" * 40,
        }
        if expr not in known:
            raise AssertionError(f"the generated workflow uses an expression this runner can't evaluate: {expr!r}")
        return known[expr]

    def expand(self, value: Any, status: str) -> str:
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(self.expression(m.group(1), status)), str(value))

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KFORGE_", "GITHUB_", "NOX_", "PYTEST_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = os.pathsep.join([str(self.python_bin), env.get("PATH", "")])
        env.update(CI="true", GITHUB_ACTIONS="true", RUNNER_TEMP=str(self.temp), GITHUB_WORKSPACE=str(self.workspace))
        return env

    def action(self, step: dict[str, Any], status: str) -> None:
        name = step["uses"].split("@")[0]
        args = {k: self.expand(v, status) for k, v in step.get("with", {}).items()}
        if name == "actions/upload-artifact":
            shutil.copytree(self.workspace / args["path"], self.artifacts / args["name"])
        elif name == "actions/download-artifact" and "pattern" in args:  # each artifact into a folder of its name
            for artifact in sorted(self.artifacts.iterdir()):
                if fnmatch.fnmatch(artifact.name, args["pattern"]):
                    shutil.copytree(artifact, self.workspace / args["path"] / artifact.name)
        elif name == "actions/download-artifact":
            shutil.copytree(self.artifacts / args["name"], self.workspace / args["path"], dirs_exist_ok=True)
        elif name == "actions/upload-pages-artifact":
            shutil.copytree(self.workspace / args["path"], self.artifacts / "github-pages")
        elif name not in ("actions/checkout", "actions/setup-python", "actions/cache"):
            raise AssertionError(f"no stand-in for {name} (a Linux job of this test should not need it)")

    def run_job(self, job: dict[str, Any]) -> tuple[str, str]:
        """Run every step; returns (job status, step summary)."""
        files = {k: self.temp / k.lower() for k in ("GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
        for path in files.values():
            path.write_text("")
        status = "success"
        env = self.base_env()
        env.update({k: self.expand(v, status) for k, v in job.get("env", {}).items()})
        for i, step in enumerate(job["steps"]):
            if not self.expression(step.get("if", "success()"), status):
                self.log.append(f"skip  {step['name']}")
                continue
            if "uses" in step:
                self.action(step, status)
                self.log.append(f"uses  {step['name']}")
                continue
            step_env = dict(env, **{k: str(p) for k, p in files.items()})
            step_env.update({k: self.expand(v, status) for k, v in step.get("env", {}).items()})
            script = self.temp / f"step{i}.sh"
            script.write_text(step["run"])
            shell = step.get("shell", "bash")
            assert shell == "bash", f"{step['name']}: shell {shell} on a Linux runner"
            started = time.monotonic()
            out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=self.workspace,
                                 env=step_env, capture_output=True, text=True, timeout=STEP_TIMEOUT)
            self.log.append(f"run   {step['name']}: exit {out.returncode} in {time.monotonic() - started:.0f} s\n"
                            f"{out.stdout[-4000:]}{out.stderr[-4000:]}")
            if out.returncode != 0:
                status = "failure"
            for line in files["GITHUB_ENV"].read_text().splitlines():  # KEY=VALUE lines carry into later steps
                key, sep, value = line.partition("=")
                if sep:
                    env[key] = value
            for line in files["GITHUB_PATH"].read_text().splitlines():
                env["PATH"] = line + os.pathsep + env["PATH"]
        return status, files["GITHUB_STEP_SUMMARY"].read_text()


def checkout(dest: Path) -> Path:
    """actions/checkout, here: this working tree's files (tracked or to be), in a fresh git repository."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():  # submodules (directories) stay empty, as checkout leaves them without `submodules:`
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "checkout"], cwd=dest, check=True)
    return dest


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("no nvcc here: the fmha build job needs one (CI has /usr/local/cuda-13.0)")
    base = tmp_path_factory.mktemp("runner")
    workspace = checkout(base / "work")
    venv = base / "setup-python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for d in ("temp", "artifacts"):
        (base / d).mkdir()
    return Runner(workspace=workspace, temp=base / "temp", python_bin=venv / "bin", artifacts=base / "artifacts")


def test_fmha_build_job_then_its_gpu_test_job(runner: Runner) -> None:
    forge = load_forge(ROOT)
    jobs = workflow_data(forge)["jobs"]
    build = jobs["build-fmha-sm90-linux"]
    status, summary = runner.run_job(build)
    log = "\n".join(runner.log)
    assert status == "success", log[-12000:]
    assert summary.startswith("### build-fmha-sm90-linux: passed"), summary
    wheels = list((runner.artifacts / "wheelhouse-fmha-sm90-linux").glob("fmha/*.whl"))
    assert len(wheels) == 1 and (runner.artifacts / "wheelhouse-fmha-sm90-linux" / "simple" / "index.html").is_file()

    print("\n".join(line.splitlines()[0] for line in runner.log))  # the steps and their times (pytest -rP shows them)
    runner.log.clear()
    status, summary = runner.run_job(jobs["test-fmha-sm90-linux"])
    print("\n".join(line.splitlines()[0] for line in runner.log))
    log = "\n".join(runner.log)
    arch, _name = detect_gpu()
    if arch is not None and arch.base.sm == "sm_90":
        assert status == "success", log[-12000:]
        assert summary.startswith("### test-fmha-sm90-linux: passed"), summary
    else:  # KFORGE_REQUIRE_GPU=1: no sm_90 GPU here is a GPU error (exit 10) that the summary names, past nox's exit 1
        assert status == "failure", log[-12000:]
        assert summary.startswith("### test-fmha-sm90-linux: no usable GPU (exit 10)"), summary + log[-6000:]
        assert "Session test-fmha-sm90 failed" in log
    # The GPU runner is persistent: its last step removed the venvs, build trees and CI scratch.
    assert [line.split(":")[0] for line in runner.log[-2:]] == ["run   summary", "run   cleanup (persistent runner)"]
    assert not (runner.workspace / ".nox").exists() and not (runner.workspace / "kforge-ci").exists()

    # The release's publish job: every wheelhouse artifact (here, fmha's) merged into one index, the Pages site.
    runner.log.clear()
    status, _summary = runner.run_job(workflow_data(forge, release=True)["jobs"]["publish"])
    print("\n".join(line.splitlines()[0] for line in runner.log))
    log = "\n".join(runner.log)
    assert "invalid choice: 'merge'" not in log, "the publish job needs `kforge wheelhouse merge` (kforge.wheels.merge)"
    assert status == "success", log[-12000:]
    site = runner.artifacts / "github-pages"
    assert [w.name for w in site.glob("fmha/*.whl")] == [wheels[0].name]
    page = next(site.glob("simple/*/index.html")).read_text()
    assert f"../../fmha/{wheels[0].name}#sha256=" in page
