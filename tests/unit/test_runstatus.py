"""The failure kind survives nox: kforge records it in $KFORGE_STATUS_FILE, `kforge ci summary` reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge import runstatus
from kforge.cli import main
from kforge.runstatus import RunStatus, read, record, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_nothing_recorded_without_the_variable(tmp_path: Path) -> None:
    assert record({}, RunStatus("build x", 4, "toolchain", "no nvcc")) is None
    assert not list(tmp_path.iterdir())


def test_records_append_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "status.jsonl"
    env = {runstatus.STATUS_ENV: str(path)}
    record(env, RunStatus("ci toolchain fmha-sm90", 4, "toolchain", "CUDA 12.8 is not installed."))
    record(env, RunStatus("test fmha-sm90", 12, "gpu test", "pytest exit code 1."))
    path.write_text(path.read_text() + "not json\n")  # a stray line is skipped, not fatal
    runs = read(path)
    assert [r.kind for r in runs] == ["toolchain", "gpu test"]
    assert runs[0].headline == "toolchain error (exit 4)" and runs[1].headline == "GPU tests failed (exit 12)"
    assert read(tmp_path / "missing") == ()


@pytest.mark.parametrize("runs, job_status, head", [
    ((RunStatus("build a", 4, "toolchain", "no nvcc"),), "failure", "toolchain error (exit 4)"),
    ((RunStatus("test a", 12, "gpu test", "x"),), "failure", "GPU tests failed (exit 12)"),
    ((RunStatus("test a", 10, "gpu", "no GPU"),), "failure", "no usable GPU (exit 10)"),
    ((), "failure", "failed outside kforge"),
    ((), "success", "passed"),
    ((RunStatus("build a", 7, "build", "x"),), "cancelled", "cancelled"),
])
def test_summary_headline(runs, job_status, head) -> None:
    text = summarize("build-a-linux", runs, job_status)
    assert text.startswith(f"### build-a-linux: {head}")
    for run in runs:
        assert f"`kforge {run.command}`" in text


def test_the_cli_records_a_kforge_error(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "status.jsonl"
    monkeypatch.setenv(runstatus.STATUS_ENV, str(path))
    code = main(["-C", str(ROOT), "plan", "fmha-sm91"])
    assert code == 3
    (run,) = read(path)
    assert run.exit_code == 3 and run.kind in ("target", "arch") and "sm91" in run.message
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("JOB_STATUS", "failure")
    assert main(["-C", str(ROOT), "ci", "summary", "build-fmha-sm91-linux"]) == 0
    assert summary.read_text().startswith("### build-fmha-sm91-linux: ")
    assert len(read(path)) == 1  # the summary added nothing to what it reports
