"""benchmarks/fmha_bwd.py's pure parts: the FLOP count of each mode and head-dim pair, the dims each
column runs at, the shape plan, rows with their same-run ratios (withheld when the gradients
differ or a column failed), the relative gradient difference, and the report and JSON it writes.
No GPU, no kernel library."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the benchmark script needs torch")

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def bench():
    return _load("fmha_bwd", ROOT / "benchmarks" / "fmha_bwd.py")


def _shape(d_qk=128, d_v=128, seqlen=4096, causal=False, heads=16) -> dict:
    return {"dtype": "bf16", "d_qk": d_qk, "d_v": d_v, "heads": heads, "seqlen": seqlen,
            "batch": 16384 // seqlen, "causal": causal}


def test_forward_flops_are_timings_at_equal_dims_and_split_otherwise(bench) -> None:
    timing = _load("timing", ROOT / "benchmarks" / "timing.py")
    for causal in (False, True):
        assert bench.attention_flops(4, 16, 4096, 128, 128, causal) == timing.flops(4, 16, 4096, 128, causal)
    assert bench.attention_flops(1, 1, 10, 192, 128, False) == 2.0 * 100 * (192 + 128)
    assert bench.attention_flops(1, 1, 10, 192, 128, True) == 100 * (192 + 128)


def test_fa_columns_run_192_at_192_192(bench) -> None:
    assert bench.column_dims("fa2", 192, 128) == (192, 192)
    assert bench.column_dims("fa3", 192, 128) == (192, 192)
    assert bench.column_dims("fa3", 192, 128, fa_192_dv=128) == (192, 128)
    assert bench.column_dims("sdpa-flash", 192, 128) == (192, 192)  # FA2's kernel: d_qk = d_v
    assert bench.column_dims("sdpa-cudnn", 192, 128) == (192, 128)
    assert bench.column_dims("kforge", 192, 128) == (192, 128)
    assert bench.column_dims("fa2", 128, 128) == (128, 128)


def test_parse_pairs(bench) -> None:
    assert bench.parse_pairs("64x64, 192x128") == [(64, 64), (192, 128)]
    with pytest.raises(ValueError, match="d_qk x d_v"):
        bench.parse_pairs("128")


def test_plan_keeps_the_tokens_and_the_hidden_size(bench) -> None:
    shapes = bench.plan(["bf16", "fp16"], [(64, 64), (192, 128)], [2048, 16384, 32768], 16384,
                        None, [False, True])
    assert len(shapes) == 2 * 2 * 2 * 3
    by = {(s["dtype"], s["d_qk"], s["seqlen"], s["causal"]): s for s in shapes}
    assert by[("bf16", 64, 2048, False)]["batch"] == 8 and by[("bf16", 64, 2048, False)]["heads"] == 32
    assert by[("fp16", 192, 16384, True)]["batch"] == 1 and by[("fp16", 192, 16384, True)]["heads"] == 16
    assert by[("bf16", 64, 32768, True)]["batch"] == 1  # at least one sequence
    assert {s["heads"] for s in bench.plan(["bf16"], [(128, 128)], [4096], 16384, 7, [False])} == {7}


def test_backward_counts_2_5x_and_fwd_bwd_3_5x_the_forward(bench) -> None:
    shape = _shape()
    fwd = bench.attention_flops(4, 16, 4096, 128, 128, False)
    bwd = bench.make_row(shape, "bwd", {"kforge": 2.0, "fa2": 1.0}, {}, {}, 0.05)
    both = bench.make_row(shape, "fwd+bwd", {"kforge": 2.0}, {}, {}, 0.05)
    assert bwd["flops"] == 2.5 * fwd and both["flops"] == 3.5 * fwd
    assert bwd["results"]["kforge"]["tflops"] == pytest.approx(2.5 * fwd / 2e-3 / 1e12)
    assert both["results"]["kforge"]["tflops"] == pytest.approx(3.5 * fwd / 2e-3 / 1e12)
    assert bwd["ratio"]["fa2"] == pytest.approx(0.5)  # kforge twice as slow: ratio 0.5


def test_forward_alone_counts_the_forward_once(bench) -> None:
    fwd = bench.attention_flops(4, 16, 4096, 192, 128, False)
    row = bench.make_row(_shape(d_qk=192, d_v=128), "fwd", {"kforge": 1.0, "sdpa-flash": 1.0},
                         {"sdpa-flash": (192, 192)}, {}, 0.05)
    assert row["flops"] == fwd
    assert row["results"]["kforge"]["tflops"] == pytest.approx(fwd / 1e-3 / 1e12)
    # SDPA flash ran (192, 192): more FLOPs in the same time, so kforge's ratio is 320 / 384
    assert row["ratio"]["sdpa-flash"] == pytest.approx(320 / 384)


def test_causal_halves_the_flops(bench) -> None:
    full = bench.make_row(_shape(causal=False), "bwd", {"kforge": 1.0}, {}, {}, 0.05)
    half = bench.make_row(_shape(causal=True), "bwd", {"kforge": 1.0}, {}, {}, 0.05)
    assert half["flops"] * 2 == full["flops"]


def test_columns_at_other_dims_count_their_own_flops(bench) -> None:
    """At (192, 128) FA3 runs (192, 192): the same time is more TFLOP/s for it, and the ratio is of
    TFLOP/s, not of time."""
    shape = _shape(192, 128)
    dims = {"kforge": (192, 128), "fa3": (192, 192)}
    row = bench.make_row(shape, "bwd", {"kforge": 1.0, "fa3": 1.0}, dims, {}, 0.05)
    ours, fa3 = row["results"]["kforge"], row["results"]["fa3"]
    assert (fa3["d_qk"], fa3["d_v"]) == (192, 192)
    assert fa3["tflops"] / ours["tflops"] == pytest.approx((192 + 192) / (192 + 128))
    assert row["ratio"]["fa3"] == pytest.approx((192 + 128) / (192 + 192))
    assert row["same_work"]["fa3"] is None  # other dims: not compared


def test_gradients_that_differ_withhold_the_ratio(bench) -> None:
    row = bench.make_row(_shape(), "bwd", {"kforge": 1.0, "sdpa-flash": 1.0, "sdpa-cudnn": 1.0}, {},
                         {"sdpa-flash": 0.2, "sdpa-cudnn": 0.01}, 0.05)
    assert row["same_work"] == {"sdpa-flash": False, "sdpa-cudnn": True}
    assert row["ratio"]["sdpa-flash"] is None and row["ratio"]["sdpa-cudnn"] == pytest.approx(1.0)
    text = bench.render(_meta(), [row])
    assert "n/a (grads differ: 0.2)" in text


def test_a_column_that_failed_shows_its_error_and_no_ratio(bench) -> None:
    row = bench.make_row(_shape(192, 128), "bwd", {"kforge": 1.0, "sdpa-cudnn": "No available kernel"},
                         {}, {}, 0.05)
    assert row["results"]["sdpa-cudnn"]["error"] == "No available kernel"
    assert row["results"]["sdpa-cudnn"]["tflops"] is None and row["ratio"]["sdpa-cudnn"] is None
    assert "- sdpa-cudnn, bf16 (192, 128), e.g. seqlen 4096 causal False bwd: No available kernel" in \
        bench.render(_meta(), [row])


def test_a_failed_kforge_column_gives_no_ratios(bench) -> None:
    row = bench.make_row(_shape(), "bwd", {"kforge": "refused", "fa2": 1.0}, {}, {}, 0.05)
    assert row["ratio"] == {"fa2": None}


def test_relative_gradient_difference(bench) -> None:
    ours = [torch.tensor([1.0, -4.0]), torch.tensor([2.0])]
    theirs = [torch.tensor([1.0, -3.8]), torch.tensor([2.1])]
    assert bench.rel_diff(ours, theirs) == pytest.approx(0.05)  # 0.2 / 4 and 0.1 / 2
    assert bench.rel_diff([torch.zeros(2)], [torch.zeros(2)]) == 0.0


def test_report_groups_by_mode_dtype_and_pair(bench, tmp_path) -> None:
    rows = [bench.make_row(_shape(seqlen=s, causal=c), m, {"kforge": 1.0, "fa2": 2.0}, {}, {"fa2": 0.0}, 0.05)
            for m in ("bwd", "fwd+bwd") for c in (False, True) for s in (2048, 4096)]
    text = bench.render(_meta(), rows)
    assert "### bwd, bf16, (d_qk, d_v) = (128, 128), 16 heads" in text
    assert "### fwd+bwd, bf16, (d_qk, d_v) = (128, 128), 16 heads" in text
    assert "| causal | seqlen | batch | kforge | fa2 | kforge/fa2 |" in text
    assert "| yes | 2048 | 8 |" in text
    md, js = bench.write_outputs(tmp_path / "sub" / "fmha-bwd", _meta(), rows)
    assert md.read_text() == text
    data = json.loads(js.read_text())
    assert data["meta"]["device"] == "NVIDIA H200" and len(data["rows"]) == 8
    assert data["rows"][0]["ratio"]["fa2"] == pytest.approx(2.0)


def test_bad_columns_are_refused_before_looking_for_a_gpu(bench, capsys) -> None:
    assert bench.main(["--columns", "kforge,fa4"]) == 2
    assert "unknown column" in capsys.readouterr().err
    assert bench.main(["--columns", "fa2"]) == 2  # no kforge column


def _meta(**change) -> dict:
    meta = {"device": "NVIDIA H200", "sms": 132, "torch": "2.11.0", "cuda": "13.0", "cudnn": 91000,
            "kforge_fmha": "0.1.0", "archs": "90a", "bwd_path": "default (portable)", "fwd_path": "default",
            "fa2_version": "2.8.3", "fa3_version": "3.0.0", "tokens": 16384, "heads_rule": "2048 // d_v",
            "fa_192_dv": 192, "runs": 30, "warmup": 5, "max_diff": 0.05,
            "command": "python benchmarks/fmha_bwd.py", "date": "2026-11-27 12:00 UTC"}
    meta.update(change)
    return meta
