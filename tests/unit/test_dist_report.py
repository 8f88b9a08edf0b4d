"""benchmarks/dist_report.py: one scaling row a cluster run, measured figures beside labelled predictions."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("dist_report", ROOT / "benchmarks" / "dist_report.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_dir(tmp_path: Path, name: str, *, split: bool, outside: float | None) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "result.json").write_text(json.dumps({
        "wall_seconds": 500.0, "ninja_wall_seconds": 440.0, "units": 127 if split else 73,
        "split": f"FLASH_ATTN_KFORGE_SPLIT_UNITS={int(split)}: ...",
        "sccache": {"dist_compiles": {"a": 300, "b": 208}, "dist_errors": 1},
        "binaries": {"cubins": {"x.cubin": "h1", "y.cubin": "h2", "z.cubin": "h9"}},
        "command": "python3 -m kforge build flash-attn-sm90 --max-jobs 64"}))
    (d / "cluster.json").write_text(json.dumps({"servers": 4, "cpus_per_server": 16, "client_max_jobs": 64,
                                                "client_cpus": None}))
    if outside is not None:
        (d / "dist-jobs.json").write_text(json.dumps({"units": {"outside_compile": {"n": 2, "sum": 2 * outside}}}))
    return d


def test_a_row_has_the_measurement_and_two_predictions(report, tmp_path: Path):
    local = {"wall_seconds": 400.0, "binaries": {"cubins": {"y.cubin": "h1", "x.cubin": "h2", "w.cubin": "h3"}}}
    line = report.row(run_dir(tmp_path, "dist4x16-1", split=True, outside=4.0), 64, local)
    cells = [c.strip() for c in line.strip("|").split("|")]
    # two of the three cubins have a byte-identical twin in the local build (under another name: matched by content)
    assert cells[:6] == ["4 x 16", "64 cut (127 units)", "500.0 s (1.25x)", "440.0 s", "508 / 1", "2 of 3"]
    assert cells[6] == "4.0 s"
    guess, measured = (float(c.rstrip(" s")) for c in cells[7:9])
    assert measured > guess  # 4 s a unit measured against the 3 s guess: the same schedule, longer


def test_the_whole_build_is_predicted_from_whole_units_and_no_overhead_means_no_second_prediction(report, tmp_path):
    cut = report.row(run_dir(tmp_path, "a", split=True, outside=None), 64, None)
    whole = report.row(run_dir(tmp_path, "b", split=False, outside=None), 64, None)
    assert cut.split("|")[8] != whole.split("|")[8]  # 127 cut units and 73 whole ones schedule differently
    assert whole.rstrip().endswith("| - |") and "500.0 s (-)" in whole  # no local build: no ratio


def test_identical_cubin_lists_say_so_and_missing_lists_are_not_a_match(report):
    same = {"binaries": {"cubins": {"a": "1", "b": "2"}}}
    assert report.cubins_same(same, same) == "all 2, by name too"
    assert report.cubins_same({}, same) == "-" and report.cubins_same(same, {}) == "-"


CLIENT = """\
[2026-11-28T17:03:22.000Z DEBUG sccache::compiler::compiler] [u1.o]: Requesting allocation
[2026-11-28T17:03:22.010Z DEBUG sccache::compiler::compiler] [u1.o]: Running job
[2026-11-28T17:03:32.000Z DEBUG sccache::compiler::compiler] fetched [("/tmp/s1/u1.o", "Size: 9->3")]
[2026-11-28T17:03:40.000Z DEBUG sccache::compiler::compiler] [u2.module_id]: Requesting allocation
[2026-11-28T17:03:40.010Z DEBUG sccache::compiler::compiler] [u2.module_id]: Running job
[2026-11-28T17:04:02.000Z DEBUG sccache::compiler::compiler] [u9.module_id]: Requesting allocation
"""


def test_a_stopped_run_is_a_lower_bound_with_a_labelled_extrapolation(report, tmp_path: Path):
    d = tmp_path / "dist1x16-1"  # no result.json nor cluster.json: the lease ended under it
    d.mkdir()
    (d / "plan.json").write_text(json.dumps({"target": "flash-attn-sm90", "jobs": {"max_jobs": 15, "split": "FLASH_ATTN_KFORGE_SPLIT_UNITS=0: ..",
                                                      "order": [["u1.o", 1], ["u2.o", 1], ["u3.o", 1]]}}))
    (d / "sccache-client.log").write_text(CLIENT)
    reference = {"job_list": [{"unit": "u1", "compile": 50.0}, {"unit": "u2", "compile": 100.0},
                              {"unit": "u2", "compile": 28.0}, {"unit": "u3", "compile": 64.0}]}
    cells = [c.strip() for c in report.row(d, 64, None, reference).strip("|").split("|")]
    assert cells[:3] == ["1 x 16", "15 whole", "stopped"]
    # stopped 40 s after the first request with u1 done; u2 ran 18 s of its 128, u3 never started: (110 + 64) / 16
    assert cells[3] == f"> 40 s (stopped: 1 of 3 units done); EXTRAPOLATED ≈ {40 + (110 + 64) / 16:.0f} s"
    assert cells[4] == "-" and cells[8] == "-"  # no server counts, no measured overhead
    no_ref = [c.strip() for c in report.row(d, 64, None).strip("|").split("|")]
    assert no_ref[3] == "> 40 s (stopped: 1 of 3 units done)"  # without a reference: the bound alone


def test_a_target_without_the_models_seed_gets_no_prediction(report, tmp_path: Path):
    d = run_dir(tmp_path, "dist1x1-1", split=False, outside=2.2)
    result = json.loads((d / "result.json").read_text())
    (d / "result.json").write_text(json.dumps({**result, "command": "python3 -m kforge build fmha-sm90 --max-jobs 1"}))
    cells = [c.strip() for c in report.row(d, 2, None).strip("|").split("|")]
    assert cells[6:] == ["2.2 s", "- (no seed for this target)", "-"]  # measured, but flash-attn's units predict nothing
