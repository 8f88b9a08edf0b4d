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
        "sccache": {"dist_compiles": {"a": 300, "b": 208}, "dist_errors": 1}}))
    (d / "cluster.json").write_text(json.dumps({"servers": 4, "cpus_per_server": 16, "client_max_jobs": 64,
                                                "client_cpus": None}))
    (d / "compare.json").write_text(json.dumps({"cubins_identical": False, "differ": ["x.cubin", "y.cubin"]}))
    if outside is not None:
        (d / "dist-jobs.json").write_text(json.dumps({"units": {"outside_compile": {"n": 2, "sum": 2 * outside}}}))
    return d


def test_a_row_has_the_measurement_and_two_predictions(report, tmp_path: Path):
    line = report.row(run_dir(tmp_path, "dist4x16-1", split=True, outside=4.0), 64, 400.0)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:6] == ["4 x 16", "64 cut (127 units)", "500.0 s (1.25x)", "440.0 s", "508 / 1", "no (2 differ)"]
    assert cells[6] == "4.0 s"
    guess, measured = (float(c.rstrip(" s")) for c in cells[7:9])
    assert measured > guess  # 4 s a unit measured against the 3 s guess: the same schedule, longer


def test_the_whole_build_is_predicted_from_whole_units_and_no_overhead_means_no_second_prediction(report, tmp_path):
    cut = report.row(run_dir(tmp_path, "a", split=True, outside=None), 64, None)
    whole = report.row(run_dir(tmp_path, "b", split=False, outside=None), 64, None)
    assert cut.split("|")[8] != whole.split("|")[8]  # 127 cut units and 73 whole ones schedule differently
    assert whole.rstrip().endswith("| - |") and "500.0 s (-)" in whole  # no local build: no ratio
