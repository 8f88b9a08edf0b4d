"""The kforge commands the generated jobs run: `ci toolchain` (real nvcc), `ci cleanup`, `ci generate --check`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.errors import ConfigError, ToolchainError
from kforge.runstatus import STATUS_ENV, read

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def kforge(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture
def installed_nvcc() -> str:
    nvcc = shutil.which("nvcc") or (os.environ.get("CUDA_HOME") and str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    if not nvcc or not Path(nvcc).is_file():
        pytest.skip("no nvcc here (CI has /usr/local/cuda-13.0)")
    return nvcc


def test_toolchain_step_finds_the_plans_cuda(installed_nvcc: str) -> None:
    version = subprocess.run([installed_nvcc, "--version"], capture_output=True, text=True).stdout
    cuda = version.split("release ")[1].split(",")[0]
    out = kforge("ci", "toolchain", "fmha-sm90", env={"KFORGE_CUDA": cuda})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("fmha-sm90: nvcc ") and "(installed)" in out.stdout


def test_toolchain_step_names_what_is_missing(tmp_path: Path, installed_nvcc: str) -> None:
    status = tmp_path / "status.jsonl"
    # CUDA 12.x can't come from PyPI: a toolchain error (exit 4), recorded for the job summary.
    out = kforge("ci", "toolchain", "flashmla-sm90", env={"KFORGE_CUDA": "12.8", STATUS_ENV: str(status)})
    assert out.returncode == ToolchainError.exit_code, out.stdout + out.stderr
    assert "CUDA 12.8 is not installed" in out.stderr and "Traceback" not in out.stderr
    (run,) = read(status)
    assert run.kind == "toolchain" and run.command == "ci toolchain flashmla-sm90"
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        version = subprocess.run([installed_nvcc, "--version"], capture_output=True, text=True).stdout
        cuda = version.split("release ")[1].split(",")[0]
        out = kforge("ci", "toolchain", "flashmla-sm90", env={"KFORGE_CUDA": cuda})
        assert out.returncode == ToolchainError.exit_code and "has no torch" in out.stderr, out.stderr


def test_cleanup_keeps_the_caches(tmp_path: Path) -> None:
    shutil.copy(ROOT / "forge.toml", tmp_path / "forge.toml")
    for rel in (".kforge/work/fmha-sm90", ".nox/build-fmha-sm90", "kforge-ci/wheelhouse", ".kforge/ccache/0", ".kforge/cache/x"):
        (tmp_path / rel).mkdir(parents=True)
    out = kforge("-C", str(tmp_path), "ci", "cleanup")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / ".kforge/work").exists() and not (tmp_path / ".nox").exists()
    assert not (tmp_path / "kforge-ci").exists()
    assert (tmp_path / ".kforge/ccache/0").is_dir() and (tmp_path / ".kforge/cache/x").is_dir()


def test_generate_check_reports_drift(tmp_path: Path) -> None:
    shutil.copy(ROOT / "forge.toml", tmp_path / "forge.toml")
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    out = kforge("-C", str(tmp_path), "ci", "generate", "--check")
    assert out.returncode == ConfigError.exit_code and "out of date" in out.stderr, out.stderr
    assert not (tmp_path / ".github").exists()
    out = kforge("-C", str(tmp_path), "ci", "generate")
    assert out.returncode == 0 and "written" in out.stdout, out.stderr
    assert (tmp_path / ".github/workflows/kforge.yml").read_text() == (ROOT / ".github/workflows/kforge.yml").read_text()
    assert kforge("-C", str(tmp_path), "ci", "generate", "--check").returncode == 0
