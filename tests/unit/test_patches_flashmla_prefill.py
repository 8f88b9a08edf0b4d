"""patches/flashmla 0015-0019: the sm_120 dense prefill, kforge_fmha's kernels carried as generated new files."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from kforge.sources.series import PatchContext, load_series, parse_patch

ROOT = Path(__file__).resolve().parents[2]
SERIES = ROOT / "patches" / "flashmla"
KERNELS = "0015-sm120-dense-prefill-kernels-copied-from-kforge_fmha.patch"
GLUE = "0016-sm120-dense-prefill-glue-from-FlashMLA-s-arguments-t.patch"
DISPATCH = "0017-api-dispatch-dense-prefill-to-the-sm120-port-on-sm_1.patch"
SETUP = "0018-setup-build-the-sm120-dense-prefill-port-glue-and-8-.patch"
TESTS = "0019-tests-checks-of-the-sm120-dense-prefill-port-kforge.patch"
PREFILL = (KERNELS, GLUE, DISPATCH, SETUP, TESTS)
DEST = "csrc/sm120/prefill/dense/"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_flashmla_prefill_patch", ROOT / "scripts" / "gen_flashmla_prefill_patch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_kernel_patch_is_what_the_script_writes(gen) -> None:
    committed = (SERIES / KERNELS).read_text(encoding="utf-8")
    assert committed == gen.render(), (
        f"patches/flashmla/{KERNELS} is stale: kernels/fmha/csrc (or the script) changed since it was written. "
        "Run `python scripts/gen_flashmla_prefill_patch.py` and commit the patch (then rebuild FlashMLA)."
    )
    assert gen.main(["--check"]) == 0


def test_the_check_mode_fails_on_a_stale_patch(gen, tmp_path: Path, monkeypatch, capsys) -> None:
    stale = tmp_path / KERNELS
    stale.write_text((SERIES / KERNELS).read_text(encoding="utf-8").replace("kforge_fmha", "kforge_fmhb", 1))
    monkeypatch.setattr(gen, "PATCH", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "run python scripts/gen_flashmla_prefill_patch.py" in capsys.readouterr().err


def test_the_kernel_patch_carries_byte_copies_and_one_unit_per_kind_dtype_and_pair(gen) -> None:
    files = {f.path: f.data for f in gen.files()}
    for header in gen.HEADERS:
        assert files[f"{DEST}fmha/{header}"] == (ROOT / "kernels" / "fmha" / "csrc" / header).read_bytes()
    units = {p for p in files if p.startswith(f"{DEST}instantiations/")}
    assert units == {f"{DEST}instantiations/{k}_{d}_{q}x{v}.cu" for k in ("fwd", "bwd") for d in ("bf16", "fp16")
                     for q, v in ((192, 128), (128, 128))}
    for path in units:
        text = files[path].decode()
        assert text.index('"sm120/prefill/dense/fmha_port.h"') < text.index('"sm120/prefill/dense/fmha/')
        ctype = "__nv_bfloat16" if "_bf16_" in path else "__half"
        assert re.search(rf"KFORGE_FMHA_INSTANTIATE\w*\({ctype}, ", text), path
        assert "kforge_launch_smem" in text or "_QKV(" in text or "_BWD(" in text, f"{path}: no launch manifest"
    parsed = parse_patch(SERIES / KERNELS)
    assert {f.path for f in parsed.files} == set(files) and all(f.old_path is None for f in parsed.files)


def test_the_carried_headers_need_nothing_but_each_other(gen) -> None:
    # Only the portable kernels: a quoted include of an sm90 header, fmha_paths.* or the C API would not
    # be in the patch, and the units would not compile in FlashMLA's tree.
    for header in gen.HEADERS:
        text = (ROOT / "kernels" / "fmha" / "csrc" / header).read_text()
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            assert inc in gen.HEADERS, f"{header} includes {inc}, which the patch does not carry"


def _added(name: str) -> list[str]:
    return [ln[1:] for ln in (SERIES / name).read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]


def test_the_wiring_patches_touch_only_their_files() -> None:
    assert {f.path for f in parse_patch(SERIES / GLUE).files} == {DEST + "interface.h", DEST + "interface.cpp"}
    assert all(f.old_path is None for f in parse_patch(SERIES / GLUE).files)
    assert parse_patch(SERIES / DISPATCH).paths == {"csrc/api/dense_prefill.h", "csrc/api/api.cpp", "flash_mla/flash_mla_interface.py"}
    assert parse_patch(SERIES / SETUP).paths == {"setup.py"}
    assert parse_patch(SERIES / TESTS).paths == {"tests/test_kforge_prefill.py"}


def test_setup_compiles_the_glue_and_every_unit(gen) -> None:
    # The hunk holds the whole SM120_PORT_SOURCES expression: evaluate it as setup.py will.
    lines = [ln[1:] for ln in (SERIES / SETUP).read_text().splitlines() if ln[:1] in (" ", "+") and not ln.startswith("+++")]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("SM120_PORT_SOURCES = ["))
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == "]")
    scope: dict = {}
    exec("\n".join(lines[start:end + 1]), scope)  # noqa: S102 (our own patch's list)
    sources = set(scope["SM120_PORT_SOURCES"])
    assert DEST + "interface.cpp" in sources
    assert {DEST + p for p, _ in gen.units()} <= sources


def test_the_dispatch_keeps_the_sm100_kernels_and_names_the_impl() -> None:
    added = "\n".join(_added(DISPATCH))
    assert 'return "sm120_mma_port"' in added and 'return "sm100_tcgen05"' in added
    assert "FMHACutlassSM100FwdRun(workspace_buffer, q, k, v" in added  # the sm100 path, same arguments
    assert "dense_decode_uses_port(arch)" in added  # one rule for decode and prefill (FLASH_MLA_FORCE_PORT)
    assert 'm.def("dense_prefill_impl"' in added and "def get_dense_prefill_impl()" in added
    assert "num_qo_heads != num_kv_heads and not port" in added  # GQA backward allowed on the port only


def test_prefill_entries_follow_the_decode_port_and_apply_everywhere() -> None:
    series = load_series(SERIES)
    names = [e.name for e in series.entries]
    assert [n for n in names if n in PREFILL] == list(PREFILL)
    assert names.index("0014-api-define-_USE_MATH_DEFINES-for-MSVC.patch") < names.index(KERNELS)
    for ctx in (PatchContext("linux-x86_64", ("sm_90a",)), PatchContext("windows-amd64", ("sm_120a",)),
                PatchContext("linux-x86_64", ("sm_100f", "sm_120a"))):
        assert set(PREFILL) <= {e.name for e in series.select(ctx)}


def test_the_new_host_and_device_code_is_msvc_safe() -> None:
    # No MSVC here (issue 13's Windows list, as for the decode port): GCC-only builtins and types in the
    # carried kernels or the glue would first fail on a Windows build.
    code = [ln.split("//", 1)[0] for name in (KERNELS, GLUE, DISPATCH) for ln in _added(name)]
    assert code
    for bad in ("__int128", "__atomic_", "__attribute__", "__builtin_expect", "__sync_"):
        assert not [ln for ln in code if bad in ln], bad
    bare_long = re.compile(r"\b(?<!long )long\b(?! long)(?! double)")
    assert not [ln for ln in code if bare_long.search(ln)], "a bare `long` (32-bit on MSVC)"
