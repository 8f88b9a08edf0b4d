"""benchmarks/fa2_bwd_tiles.py's pure parts: the harness's nvcc command, the check of a
flash-attention tree, the backward's FLOPs, the report's ratios, and the clear refusals of bad
arguments. No GPU, no nvcc run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("fa2_bwd_tiles", ROOT / "benchmarks" / "fa2_bwd_tiles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_command_names_the_tree_and_the_arch(bench, tmp_path) -> None:
    cmd = bench.build_command(tmp_path, tmp_path / "lib.so", "90")
    assert cmd[0] == "nvcc" and cmd[-2:] == ["-o", str(tmp_path / "lib.so")]
    assert "arch=compute_90,code=sm_90" in cmd
    incs = [c[2:] for c in cmd if c.startswith("-I")]
    assert str(tmp_path / "csrc/cutlass/include") in incs
    assert str(tmp_path / "csrc/flash_attn/src") in incs
    # our stand-in for torch's c10/cuda/CUDAException.h comes first on the path
    assert incs[0] == str(ROOT / "benchmarks" / "fa2_tiles")
    assert (ROOT / "benchmarks/fa2_tiles/c10/cuda/CUDAException.h").is_file()
    assert str(bench.SOURCE) in cmd and bench.SOURCE.is_file()


def test_check_tree_says_what_is_missing(bench, tmp_path) -> None:
    why = bench.check_tree(tmp_path)
    assert "flash_bwd_launch_template.h" in why and "cute/tensor.hpp" in why and "--fa2-src" in why
    for rel in ("csrc/flash_attn/src/flash_bwd_launch_template.h", "csrc/cutlass/include/cute/tensor.hpp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert bench.check_tree(tmp_path) is None


def test_backward_flops_are_two_and_a_half_forwards(bench) -> None:
    pytest.importorskip("torch", reason="the FLOP count is benchmarks/fmha_bwd.py's, which imports torch")
    fwd = 2.0 * 2 * 16 * 4096 * 4096 * (192 + 128)
    assert bench.bwd_flops(2, 16, 4096, 192, 128, False) == pytest.approx(2.5 * fwd)
    assert bench.bwd_flops(2, 16, 4096, 192, 128, True) == pytest.approx(1.25 * fwd)


def test_render_gives_same_run_ratios_and_dashes_for_failures(bench) -> None:
    meta = {"device": "GPU", "torch": "2.x", "date": "d", "command": "c", "runs": 10,
            "smem": {"h100": {128: 147456}, "99k": {128: 81920}}}
    rows = [{"d_qk": 128, "d_v": 128, "causal": False, "seqlen": 4096, "diff": 1.0e-03,
             "tflops": {"fa2-h100": 300.0, "fa2-99k": 250.0, "kforge-portable": 225.0, "sdpa-flash": 290.0}},
            {"d_qk": 192, "d_v": 128, "causal": True, "seqlen": 2048, "diff": 1.0e-03,
             "tflops": {"fa2-h100": 200.0, "fa2-99k": "fa2t_bwd returned 1", "kforge-portable": 150.0,
                        "sdpa-flash": 210.0}}]
    text = bench.render(meta, rows)
    first = next(ln for ln in text.splitlines() if ln.startswith("| (128, 128)"))
    assert "| 0.90 | 0.75 | 0.83 |" in first  # 225/250, 225/300, 250/300
    second = next(ln for ln in text.splitlines() if ln.startswith("| (192, 128)"))
    assert "fa2t_bwd returned 1" in second and "| - | 0.75 | - |" in second


@pytest.mark.parametrize("argv, message", [
    (["run", "--lib", "LIB", "--pairs", "96x96"], "head dims 64, 128 and 192 only"),
    (["run", "--lib", "LIB", "--pairs", "128by128"], "--pairs is like"),
    (["run", "--lib", "LIB"], "does not exist; build it first"),
    (["build", "--fa2-src", "TREE", "--out", "x.so"], "not a flash-attention tree"),
])
def test_bad_arguments_get_one_line_and_exit_2(bench, tmp_path, capsys, argv, message) -> None:
    argv = [str(tmp_path / "nothing") if a in ("LIB", "TREE") else a for a in argv]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_file_that_is_not_the_harness_gets_a_clear_error(bench, tmp_path, capsys, monkeypatch) -> None:
    torch = pytest.importorskip("torch", reason="the run path imports torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    bogus = tmp_path / "libfa2tiles.so"
    bogus.write_text("not a shared library")
    assert bench.main(["run", "--lib", str(bogus)]) == 2
    err = capsys.readouterr().err
    assert "is not the harness library" in err and "fa2_bwd_tiles.py build" in err and "Traceback" not in err
