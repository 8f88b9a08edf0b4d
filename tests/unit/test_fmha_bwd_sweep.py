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


def test_variant_dims_follow_the_pair_its_knobs_name(sweep) -> None:
    assert sweep.variant_dims([]) == [128, 64]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_128_WARPS=8", sweep.BIG]) == [128]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_64_BM=128"]) == [64]
    assert sweep.variant_dims(["KFORGE_FMHA_BWD_DQ_V4=1"]) == [128, 64]


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


def test_every_variant_definition_is_a_knob_of_the_kernel(sweep) -> None:
    csrc = ROOT / "kernels" / "fmha" / "csrc"
    text = (csrc / "fmha_bwd_config.h").read_text() + (csrc / "fmha_bwd_kernel.cuh").read_text()
    known = set(re.findall(r"#(?:ifndef|ifdef|if) (KFORGE_FMHA_BWD_\w+)", text))
    for name, (defines, _) in sweep.VARIANTS.items():
        for d in defines:
            assert d.partition("=")[0] in known, f"variant {name}: {d} is not read by the kernel"
    assert set(sweep.DEFAULT_VARIANTS) <= set(sweep.VARIANTS) and sweep.DEFAULT_VARIANTS[0] == "base"
