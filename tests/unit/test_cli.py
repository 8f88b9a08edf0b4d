"""The kforge command and nox -l, run as a user would: real processes, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kforge_testkit
import pytest

from kforge.errors import ArchError, ConfigError, TargetError, ToolchainError

ROOT = Path(__file__).resolve().parents[2]


def kforge(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return kforge_testkit.kforge(*args, cwd=cwd, timeout=120)


def test_plan_prints_env_and_flags() -> None:
    out = kforge("plan", "flashmla-sm120")
    assert out.returncode == 0, out.stderr
    assert "FLASH_MLA_DISABLE_SM90=1" in out.stdout and "FLASH_MLA_DISABLE_SM100=1" in out.stdout
    assert "code=sm_120a" in out.stdout


def test_plan_json() -> None:
    out = kforge("plan", "flash-attn-sm120-windows", "--json")
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)["env"]
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "120" and env["DISTUTILS_USE_SDK"] == "1"


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["plan", "flashmal-sm90"], TargetError.exit_code, ["unknown project 'flashmal'", "kforge targets"]),
        (["plan", "fmha-sm_42"], ArchError.exit_code, ["not a CUDA arch"]),
        (["plan", "flashmla-sm80"], ArchError.exit_code, ["does not support sm_80", "projects.flashmla.archs"]),
        (["plan", "flashinfer-sm103", "--cuda", "12.8"], ToolchainError.exit_code, ["needs CUDA 12.9", "12.8"]),
        (["plan", "fmha-sm90", "--env", "NOEQUALS"], ConfigError.exit_code, ["KEY=VALUE"]),
    ],
)
def test_error_paths(args, code, needles) -> None:
    out = kforge(*args)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr


def test_malformed_forge_toml(tmp_path: Path) -> None:
    (tmp_path / "forge.toml").write_text('[platforms.linux-x86_64]\nos = "linux"\n[projects.x]\nsource = { local = "k" }\narchs = ["sm_90a"]\nbakend = "native"\n')
    out = kforge("-C", str(tmp_path), "plan", "x-sm90")
    assert out.returncode == ConfigError.exit_code
    assert "projects.x.bakend" in out.stderr and "did you mean 'backend'" in out.stderr
    assert "Traceback" not in out.stderr
    verbose = kforge("-v", "-C", str(tmp_path), "plan", "x-sm90")
    assert "Traceback" in verbose.stderr and verbose.returncode == ConfigError.exit_code


def test_no_forge_toml(tmp_path: Path) -> None:
    out = kforge("plan", "fmha-sm90", cwd=tmp_path)
    assert out.returncode == ConfigError.exit_code and "no forge.toml" in out.stderr


def test_targets_lists_the_matrix() -> None:
    out = kforge("targets", "--json")
    rows = {t["id"]: t for t in json.loads(out.stdout)}
    assert {"flashmla-sm120", "fmha-sm90", "flash-attn-sm120-windows", "flash-attn-release"} <= set(rows)
    assert rows["flash-attn-release"]["archs"] == ["sm_80", "sm_90", "sm_100", "sm_120"]
    assert rows["fmha-sm90"]["arch"] == "sm_90a" and rows["fmha-sm90"]["archs"] == ["sm_90a"]
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert rows["fmha-sm90"]["variants"] == [f"cu130-{py}"]  # forge.toml's fmha release matrix
    assert "cu128-torch2.9-cp312" in rows["flash-attn-sm90"]["variants"]
    assert rows["flashmla-sm120"]["variants"] == []  # no release matrix


def test_plan_of_a_multi_arch_target_shows_the_rendered_set() -> None:
    out = kforge("plan", "flash-attn-sm80+sm120-windows")
    assert out.returncode == 0, out.stderr
    assert "FLASH_ATTN_CUDA_ARCHS=80;120" in out.stdout and "torch2.11.sm80.sm120" in out.stdout


def test_exit_codes_are_distinct() -> None:
    from kforge import errors

    classes = [getattr(errors, n) for n in ("ConfigError", "TargetError", "ToolchainError", "SourceError", "PatchError",
                                             "BuildError", "RepairError", "DoctorError", "GPUError", "PublishError",
                                             "GpuTestError")]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes) and 0 not in codes and 1 not in codes


def test_nox_lists_the_sessions() -> None:
    out = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[1] for line in out.stdout.splitlines() if line.startswith(("* ", "- "))}
    for name in ("build-flashmla-sm120", "build-flashmla-sm100", "build-flash-attn-sm90", "build-flash-attn-sm120-windows",
                 "build-flash-attn3-sm90", "build-flashinfer-sm120", "build-fmha-sm90", "test-fmha-sm90",
                 "patch-flashmla", "tests", "lint", "build-fmha", "release-fmha", "release-flash-attn"):
        assert name in listed, name
    assert "needs a windows-amd64 host" in out.stdout


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["plan", "fmha-sm90", "--cuda", "abc"], ToolchainError.exit_code, "--cuda='abc'"),
        (["plan", "fmha-sm90", "--max-jobs", "0"], 2, "not a positive whole number"),
        (["targets", "--project", "flashmal"], ConfigError.exit_code, "did you mean 'flashmla'"),
        (["plan", "flash-attn-sm90a"], ArchError.exit_code, "takes plain arch numbers"),
        (["plan", "fmha-sm90", "--torch", "2.9.1"], ConfigError.exit_code, "torch-free"),
        (["plan", "flash-attn-sm90", "--python", "two"], ConfigError.exit_code, "--python='two' is not a Python version"),
        (["plan", "flash-attn-sm90", "--torch", "2.x"], ConfigError.exit_code, "--torch='2.x'"),
        (["release", "flashmla", "--dry-run"], ConfigError.exit_code, "declares no release matrix"),
        (["release", "fmha", "--cuda", "12.8", "--dry-run"], ConfigError.exit_code, "does not apply to a release"),
        (["release", "fmah", "--dry-run"], ConfigError.exit_code, "did you mean 'fmha'"),
    ],
)
def test_more_error_paths(args, code, needle) -> None:
    out = kforge(*args)
    assert out.returncode == code, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_closed_pipe_is_quiet(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`kforge targets | head -1`: the reader is gone before kforge writes."""
    import os

    from kforge import cli

    read_end, write_end = os.pipe()
    os.close(read_end)
    broken = open(write_end, "w", buffering=1)  # line-buffered, as a terminal-less stdout flushes at exit anyway
    monkeypatch.setattr(sys, "stdout", broken)
    code = cli.main(["-C", str(ROOT), "targets"])
    monkeypatch.undo()
    assert code == 141
    assert "Traceback" not in capsys.readouterr().err


def test_targets_json_gives_an_arch_set_target_the_variants_its_release_matrix_builds(tmp_path: Path) -> None:
    kforge_testkit.write_forge_toml(tmp_path, """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a"]
arch_sets = { release = ["sm_80", "sm_90a"] }
[projects.demo.release]
archs = ["release", "sm_80"]
variants = [{ cuda = "13.0" }]
""")
    out = kforge("-C", str(tmp_path), "targets", "--json")
    assert out.returncode == 0, out.stderr
    rows = {t["id"]: t["variants"] for t in json.loads(out.stdout)}
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert rows["demo-release"] == rows["demo-sm80"] == [f"cu130-{py}"] and rows["demo-sm90"] == []


def test_an_unexpected_os_error_is_one_paragraph_that_says_error_once(monkeypatch, capsys) -> None:
    from kforge import cli
    from kforge.config import inputs

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", "/srv/wheelhouse/fmha")

    monkeypatch.setattr(inputs, "check_args", refuse)
    code = cli.main(["plan", "fmha-sm90"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert err.startswith("kforge: error: Permission denied (/srv/wheelhouse/fmha)") and "error error" not in err
    assert "Make the folder writable" in err  # what to do


def test_a_cuda_version_of_four_parts_is_refused() -> None:
    out = kforge("plan", "flashinfer-sm120", "--cuda", "12.8.1.2")
    assert out.returncode == ToolchainError.exit_code and "Traceback" not in out.stderr
    assert "'12.8.1.2' is not a CUDA version" in out.stderr and "MAJOR.MINOR" in out.stderr


def test_targets_has_a_header_and_marks_other_hosts_and_what_ci_leaves_out() -> None:
    out = kforge("targets").stdout.splitlines()
    assert out[0].split() == ["TARGET", "ARCHS", "PLATFORM", "NOTE"]
    rows = {line.split()[0]: line for line in out[1:-1]}
    assert "needs a windows-amd64 host" in rows["flash-attn-sm120-windows"]
    assert "not in CI" in rows["flash-attn-release"]  # an arch set: a fat release build, run by hand
    assert "needs" not in rows["fmha-sm90"] and "not in CI" not in rows["fmha-sm90"]
    assert out[-1].startswith("(this host: ")
