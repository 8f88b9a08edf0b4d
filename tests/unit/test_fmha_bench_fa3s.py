"""benchmarks/fa3_standalone_vs_torch.py's pure parts: TFLOP/s and the same-run ratio of a shape, the
ratio withheld when the two outputs differ (different work) or a column failed, the host-cost
medians, and the report and JSON it writes. No GPU, no kernel library."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the benchmark script needs torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("fa3_standalone_vs_torch",
                                                  ROOT / "benchmarks" / "fa3_standalone_vs_torch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shape(seqlen: int = 4096, causal: bool = False) -> dict:
    return {"dtype": "bfloat16", "head_dim": 128, "heads": 16, "seqlen": seqlen, "batch": 16384 // seqlen,
            "causal": causal}


def test_tflops_and_the_same_run_ratio(bench) -> None:
    row = bench.make_row(_shape(), {"standalone": 0.5, "fa3": 0.6}, diff=0.0, max_diff=2e-2)
    fl = 4.0 * 4 * 16 * 4096 * 4096 * 128
    assert row["flops"] == fl
    assert row["results"]["standalone"]["tflops"] == pytest.approx(fl / 0.5e-3 / 1e12)
    assert row["results"]["fa3"]["tflops"] == pytest.approx(fl / 0.6e-3 / 1e12)
    assert row["ratio"] == pytest.approx(0.6 / 0.5)  # faster standalone: ratio > 1
    assert row["same_work"] is True and row["max_abs_diff"] == 0.0


def test_causal_halves_the_flops(bench) -> None:
    full = bench.make_row(_shape(causal=False), {"standalone": 1.0}, None, 2e-2)
    half = bench.make_row(_shape(causal=True), {"standalone": 1.0}, None, 2e-2)
    assert half["flops"] * 2 == full["flops"]
    assert half["results"]["standalone"]["tflops"] * 2 == pytest.approx(full["results"]["standalone"]["tflops"])


def test_outputs_that_differ_get_no_ratio(bench) -> None:
    row = bench.make_row(_shape(), {"standalone": 0.5, "fa3": 0.6}, diff=0.3, max_diff=2e-2)
    assert row["same_work"] is False and row["ratio"] is None
    text = bench.render(_meta(), [row], {})
    assert "| no | 4096 | 4 | " in text and "n/a (outputs differ) | 0.3 |" in text


def test_a_column_that_failed_shows_its_error_and_no_ratio(bench) -> None:
    row = bench.make_row(_shape(), {"standalone": 0.5, "fa3": "head dim not built"}, diff=None, max_diff=2e-2)
    assert row["results"]["fa3"] == {"ms": None, "tflops": None, "error": "head dim not built"}
    assert row["ratio"] is None and row["same_work"] is None
    assert "- fa3, seqlen 4096, causal False: head dim not built" in bench.render(_meta(), [row], {})


def test_without_an_fa3_column(bench) -> None:
    row = bench.make_row(_shape(), {"standalone": 0.5}, diff=None, max_diff=2e-2)
    assert row["same_work"] is None and row["ratio"] is None
    assert "| n/a | n/a | n/a |" in bench.render(_meta(fa3_version=None), [row], {})


def test_host_medians_and_means_in_microseconds(bench) -> None:
    host = bench.summarize_host({"a": [10e-6, 30e-6, 20e-6, 1000e-6], "b": []})
    assert host["a"] == pytest.approx({"calls": 4, "median_us": 25.0, "mean_us": 265.0, "min_us": 10.0})
    assert host["b"] == {"calls": 0, "median_us": None, "mean_us": None, "min_us": None}


def _meta(**change) -> dict:
    meta = {"device": "NVIDIA H100 80GB HBM3", "sms": 132, "torch": "2.11.0", "cuda": "13.0", "profile": "minimal",
            "archs": "90a", "fa3_version": "3.0.0", "tokens": 16384, "heads": 16, "head_dim": 128, "runs": 30,
            "warmup": 5, "num_splits": 1, "max_diff": 0.02, "command": "python benchmarks/fa3_standalone_vs_torch.py",
            "date": "2026-11-27 05:00 UTC"}
    meta.update(change)
    return meta


def test_report_tables(bench) -> None:
    rows = [bench.make_row(_shape(2048), {"standalone": 0.2, "fa3": 0.21}, 0.0, 2e-2),
            bench.make_row(_shape(16384, True), {"standalone": 2.0, "fa3": 1.9}, 0.0039, 2e-2)]
    host = bench.summarize_host({"standalone flash_attn_func, default stream, mode side": [20e-6, 22e-6, 21e-6]})
    text = bench.render(_meta(), rows, host)
    lines = text.splitlines()
    assert "| causal | seqlen | batch | standalone | FA3 | ratio | max abs diff |" in lines
    t0 = rows[0]["results"]
    assert (f"| no | 2048 | 8 | {t0['standalone']['tflops']:.0f} | {t0['fa3']['tflops']:.0f} | 1.050 | 0 |"
            in lines)
    assert any(line.startswith("| yes | 16384 | 1 | ") and line.endswith("| 0.950 | 0.0039 |") for line in lines)
    assert "| standalone flash_attn_func, default stream, mode side | 21.0 | 21.0 | 20.0 | 3 |" in lines
    assert "NVIDIA H100 80GB HBM3" in text and "FA3 wheel 3.0.0" in text and "num_splits=1 for both" in text


def test_outputs_are_written_as_markdown_and_json(bench, tmp_path: Path) -> None:
    rows = [bench.make_row(_shape(), {"standalone": 0.5, "fa3": 0.5}, 0.0, 2e-2)]
    host = bench.summarize_host({"x": [1e-5]})
    md, js = bench.write_outputs(tmp_path / "out" / "fa3s", _meta(), rows, host)
    assert (md.name, js.name) == ("fa3s.md", "fa3s.json")
    assert md.read_text() == bench.render(_meta(), rows, host)
    data = json.loads(js.read_text())
    assert data["rows"][0]["ratio"] == pytest.approx(1.0) and data["host"]["x"]["calls"] == 1
    assert data["meta"]["profile"] == "minimal"
    assert not list(tmp_path.glob("out/*.tmp"))
