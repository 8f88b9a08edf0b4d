"""benchmarks/fmha_bwd_sweep.py's pure parts: the ptxas report it reads per variant, the head dims a
variant times, the verdict of its gradient checks, the table, and that every variant's definitions
are knobs that csrc/fmha_bwd_config.h (or fmha_bwd_kernel.cuh) reads. No GPU, no compiler."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def sweep():
    spec = importlib.util.spec_from_file_location("fmha_bwd_sweep", ROOT / "benchmarks" / "fmha_bwd_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PTXAS = """\
ptxas info    : Compiling entry function '_ZN11kforge_fmha26fmha_bwd_preprocess_kernelI13__nv_bfloat16Li128ELi128EEEvNS_9BwdParamsE' for 'sm_90a'
ptxas info    : Used 38 registers
ptxas info    : Compiling entry function '_ZN11kforge_fmha15fmha_bwd_kernelI13__nv_bfloat16Li128ELi128ELb1EEEvNS_9BwdParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN11kforge_fmha15fmha_bwd_kernelI13__nv_bfloat16Li128ELi128ELb1EEEvNS_9BwdParamsE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 249 registers, used 1 barriers
ptxas info    : Compiling entry function '_ZN11kforge_fmha15fmha_bwd_kernelI6__halfLi128ELi128ELb0EEEvNS_9BwdParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN11kforge_fmha15fmha_bwd_kernelI6__halfLi128ELi128ELb0EEEvNS_9BwdParamsE
    16 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16 bytes cumulative stack size
"""


def test_ptxas_report_of_the_main_kernels_only(sweep) -> None:
    ks = sweep.parse_ptxas(PTXAS)
    assert [(k["dtype"], k["d_qk"], k["causal"], k["registers"], k["spill_stores"]) for k in ks] == [
        ("bf16", 128, True, 249, 0), ("fp16", 128, False, 255, 16)]
    assert sweep.ptxas_summary(ks, 128) == "249-255 regs, SPILLS 48 B"
    assert sweep.ptxas_summary(ks[:1], 128) == "249-249 regs, no spills"
    assert sweep.ptxas_summary(ks, 64) == "n/a"
    assert sweep.ptxas_summary(ks, 128, d_v=192) == "n/a"  # only (128, 128) kernels here


def test_variant_dims_follow_the_pair_its_knobs_name(sweep) -> None:
    assert sweep.variant_dims([]) == [128, 64]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_128_WARPS=8", sweep.BIG]) == [128]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_64_BM=128"]) == [64]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_DQ_V4=1"]) == [128, 64]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_192_KUNROLL=1"]) == [192]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_192_KUNROLL=1", "KFORGE_FMHA_BWD_64_BM=128"]) == [128, 64]
    assert sweep.pair_of(192) == (192, 128) and sweep.pair_of(64) == (64, 64)


def test_verdict_flags_a_different_or_less_accurate_variant(sweep) -> None:
    ok = [{"err": 0.030, "base_err": 0.031, "diff": 4e-3, "floor": 8e-3}]
    assert sweep.verdict(ok, 2e-2) == ("ok", 4e-3, pytest.approx(0.030 / 0.031))
    assert sweep.verdict([{**ok[0], "diff": 0.3}], 2e-2)[0] == "BAD"  # other gradients
    assert sweep.verdict([{**ok[0], "err": 0.2}], 2e-2)[0] == "BAD"  # far less accurate
    assert sweep.verdict([{**ok[0], "err": float("nan")}], 2e-2)[0] == "BAD"


def test_table_has_a_ratio_cell_per_timed_row_and_none_for_bad_variants(sweep) -> None:
    row = {"d_qk": 128, "seqlen": 4096, "causal": True, "tflops": 250.0, "sdpa_tflops": 240.0,
           "ratio": 250 / 240}
    results = [{"name": "base", "defines": [], "note": "n", "verdict": "baseline", "rows": [row]},
               {"name": "x", "defines": ["A=1"], "note": "m", "verdict": "BAD", "rows": [row]}]
    text = sweep.render({"arch": "90a", "runs": 8, "baseline": "base", "date": "d", "command": "c"},
                        results)
    lines = [ln for ln in text.splitlines() if ln.startswith("| base") or ln.startswith("| x")]
    assert "1.04 (250)" in lines[0] and "d128 L4k c" in text
    assert "1.04" not in lines[1] and "BAD" in lines[1]


NINJA = """\
[1/4] Building CUDA object CMakeFiles/kforge_fmha_common.dir/csrc/fmha_fwd_bf16_hdim128.cu.o
ptxas info    : Compiling entry function '_ZN11kforge_fmha15fmha_bwd_kernelI13__nv_bfloat16Li128ELi128ELb1EEEvNS_9BwdParamsE' for 'sm_90a'
ptxas info    : Used 200 registers, used 1 barriers
[2/4] Building CUDA object CMakeFiles/kforge_fmha_v_dkss-dqsmem.dir/csrc/fmha_bwd_sm90_bf16_hdim128.cu.o
ptxas info    : Compiling entry function '_ZN11kforge_fmha7sm90bwd20fmha_bwd_sm90_kernelI13__nv_bfloat16Li128ELb1EEEvNS_9BwdParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN11kforge_fmha7sm90bwd20fmha_bwd_sm90_kernelI13__nv_bfloat16Li128ELb1EEEvNS_9BwdParamsE
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 4 barriers, 8 bytes cumulative stack size
[3/4] Building CUDA object CMakeFiles/kforge_fmha_v_base.dir/csrc/fmha_bwd_sm90_bf16_hdim64.cu.o
ptxas info    : Compiling entry function '_ZN11kforge_fmha7sm90bwd20fmha_bwd_sm90_kernelI13__nv_bfloat16Li64ELb0EEEvNS_9BwdParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN11kforge_fmha7sm90bwd20fmha_bwd_sm90_kernelI13__nv_bfloat16Li64ELb0EEEvNS_9BwdParamsE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 188 registers, used 3 barriers
[4/4] Linking CUDA shared library variants/base/libkforge_fmha.so
"""


def test_build_output_goes_to_the_variant_whose_unit_printed_it(sweep) -> None:
    per = sweep.split_ninja_output(NINJA)
    assert sorted(per) == ["base", "dkss-dqsmem"]  # the common unit's report belongs to no one
    ks = sweep.parse_ptxas(per["dkss-dqsmem"])
    assert [(k["path"], k["d_qk"], k["d_v"], k["causal"], k["registers"]) for k in ks] == [
        ("sm90", 128, 128, True, 255)]
    assert sweep.ptxas_summary(ks, 128, "sm90") == "255-255 regs, SPILLS 28 B"
    assert sweep.ptxas_summary(ks, 128) == "n/a"  # not the portable kernel
    assert sweep.ptxas_summary(sweep.parse_ptxas(per["base"]), 64, "sm90") == "188-188 regs, no spills"


def test_baseline_comparison_and_kernel_check(sweep) -> None:
    import torch

    g = [torch.ones(2, 3), torch.full((2, 3), 2.0), torch.zeros(2, 3)]
    base = {"bf16-128-c": {"grads": g, "err": 0.01}}
    mine = {"bf16-128-c": {"grads": [g[0] * 1.5, g[1], g[2]], "err": 0.02}}
    checks = [{"case": "bf16-128-c", "err": 0.02, "diff": None, "base_err": None, "floor": 8e-3}]
    sweep.compare_with_baseline(checks, mine, base)
    assert checks[0]["base_err"] == 0.01 and checks[0]["diff"] == pytest.approx(0.5)  # dQ: 0.5 / 1
    assert sweep.verdict(checks, 2e-2)[0] == "BAD"  # a wrong variant is flagged
    rows = [{"d_qk": 128, "seqlen": 4096, "kernel": "kforge: fwd_sm90_tma / bwd_mma_sync"}]
    assert "bwd_mma_sync" in sweep.wrong_kernel(rows, "bwd_sm90_wgmma")
    assert sweep.wrong_kernel(rows, "bwd_mma_sync") is None


def test_sm90_cells_show_a_ratio_per_reference_column(sweep) -> None:
    row = {"d_qk": 128, "seqlen": 8192, "causal": False, "tflops": 600.0,
           "ratios": {"sdpa-flash": 1.8, "sdpa-cudnn": 1.05}, "ratio": 1.8}
    results = [{"name": "base", "defines": [], "note": "n", "verdict": "baseline", "rows": [row]}]
    text = sweep.render({"arch": "90a", "runs": 8, "baseline": "base", "date": "d", "command": "c",
                         "path": "sm90", "columns": ["sdpa-flash", "sdpa-cudnn"]}, results)
    assert "sm90 backward" in text and "1.80 / 1.05 (600)" in text


def test_every_variant_definition_is_a_knob_of_the_kernel(sweep) -> None:
    csrc = ROOT / "kernels" / "fmha" / "csrc"
    text = (csrc / "fmha_bwd_config.h").read_text() + (csrc / "fmha_bwd_kernel.cuh").read_text()
    known = set(re.findall(r"#(?:ifndef|ifdef|if) (KFORGE_FMHA_BWD_\w+)", text))
    for name, (defines, _) in sweep.VARIANTS.items():
        for d in defines:
            assert d.partition("=")[0] in known, f"variant {name}: {d} is not read by the kernel"
    assert set(sweep.DEFAULT_VARIANTS) <= set(sweep.VARIANTS) and sweep.DEFAULT_VARIANTS[0] == "base"
    sm90 = (csrc / "fmha_bwd_sm90.cuh").read_text() + (csrc / "fmha_bwd_sm90_tl.cuh").read_text()
    known90 = set(re.findall(r"#(?:ifndef|ifdef|if) (KFORGE_FMHA_BWD_SM90_\w+)", sm90))
    for name, (defines, _) in sweep.SM90_VARIANTS.items():
        for d in defines:
            assert d.partition("=")[0] in known90, f"sm90 variant {name}: {d} is not read by the kernel"
    assert set(sweep.SM90_DEFAULT_VARIANTS) <= set(sweep.SM90_VARIANTS)
    assert sweep.SM90_DEFAULT_VARIANTS[0] == "base" and not sweep.SM90_VARIANTS["base"][0]


def test_sweep_units_reach_the_sm90_backward(sweep) -> None:
    """The sm90 path's per-variant units are the sm_90a backward's (and the C API), and the
    portable path's include them too (its definitions reach every backward unit)."""
    cmake = (ROOT / "kernels" / "fmha" / "CMakeLists.txt").read_text()
    units = re.findall(r"csrc/(fmha_\w+\.(?:cu|cpp))", cmake)
    sm90 = [u for u in units if re.search(sweep.PATHS["sm90"]["units"], u)]
    assert sorted(sm90) == ["fmha_api.cpp", "fmha_bwd_sm90_bf16_hdim128.cu", "fmha_bwd_sm90_bf16_hdim64.cu",
                            "fmha_bwd_sm90_fp16_hdim128.cu", "fmha_bwd_sm90_fp16_hdim64.cu"]
    assert set(sm90) <= {u for u in units if re.search(sweep.PATHS["portable"]["units"], u)}
    assert "KFORGE_FMHA_SWEEP_VARIANTS" in cmake and "KFORGE_FMHA_SWEEP_UNITS" in cmake


def test_sm90_sweep_runs_variants_side_by_side_and_flags_a_wrong_one(sweep, tmp_path, monkeypatch) -> None:
    """main() without a GPU: the build and the workers are stand-ins; each worker saves its
    gradients and prints its RESULT line, as the real one does. Workers get one GPU each and
    KFORGE_FMHA_BWD_PATH=sm90; the parent compares every variant's gradients with the first's."""
    import json
    import subprocess
    import threading
    import time

    import torch

    def fake_build(results, build_dir, arch, jobs, path, log, dry_run, full_build, units):
        for r in results:
            r["lib"], r["ptxas"] = str(tmp_path / r["name"] / "libkforge_fmha.so"), []

    seen, lock = [], threading.Lock()

    def fake_run(cmd, env=None, **kw):
        name = cmd[cmd.index("--name") + 1]
        grads = [torch.ones(2, 2) * (3.0 if name == "dkss" else 1.0)]  # dkss: wrong dQ
        out_path = Path(cmd[cmd.index("--grads") + 1])
        out_path.parent.mkdir(parents=True, exist_ok=True)  # as the worker does
        torch.save({"bf16-128-c": {"grads": grads, "err": 0.01}}, out_path)
        with lock:
            seen.append((name, env["CUDA_VISIBLE_DEVICES"], env["KFORGE_FMHA_BWD_PATH"]))
        time.sleep(0.3)  # a run takes a while: the other GPU's loop takes the next variant
        row = {"d_qk": 128, "seqlen": 4096, "causal": True, "tflops": 500.0,
               "kernel": "kforge: fwd_sm90_tma / bwd_sm90_wgmma",
               "ratios": {"sdpa-flash": 1.4, "sdpa-cudnn": 0.9}, "ratio": 1.4}
        out = {"device": "fake", "torch": "x", "rows": [row],
               "checks": [{"case": "bf16-128-c", "err": 0.01, "diff": None, "base_err": None,
                           "floor": 8e-3}]}
        return subprocess.CompletedProcess(cmd, 0, "RESULT " + json.dumps(out) + "\n", "")

    monkeypatch.setattr(sweep, "build_variants", fake_build)
    monkeypatch.setattr(sweep.subprocess, "run", fake_run)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rc = sweep.main(["--path", "sm90", "--variants", "base,dkss,dqsmem", "--gpus", "2",
                     "--build-dir", str(tmp_path), "--out", str(tmp_path / "t")])
    assert rc == 0
    assert sorted(n for n, _, _ in seen) == ["base", "dkss", "dqsmem"]
    assert {g for _, g, _ in seen} == {"0", "1"} and {p for _, _, p in seen} == {"sm90"}
    text = (tmp_path / "t.md").read_text()
    rows = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert "baseline" in rows["base"] and "1.40 / 0.90 (500)" in rows["base"]
    assert "BAD" in rows["dkss"] and "1.40" not in rows["dkss"]
    assert "| ok |" in rows["dqsmem"]
