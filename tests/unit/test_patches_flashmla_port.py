"""patches/flashmla carries the sm_120 port as our own new files, selected for every build, with its Windows fix."""

from __future__ import annotations

import re
from pathlib import Path

from kforge.sources.series import PatchContext, load_series, parse_patch

SERIES = Path(__file__).resolve().parents[2] / "patches" / "flashmla"
PORT = "0011-sm120-dense-decode-port-with-mma.sync-ldmatrix-and-c.patch"
DISPATCH = "0012-api-dispatch-dense-decode-to-the-sm120-port-on-sm_12.patch"
SETUP = "0013-setup-build-the-sm120-port-drop-the-kernel-families-.patch"
MSVC = "0014-api-define-_USE_MATH_DEFINES-for-MSVC.patch"


def test_the_port_patch_only_adds_new_files_of_ours() -> None:
    parsed = parse_patch(SERIES / PORT)
    assert parsed.files, "the port patch holds no files"
    for f in parsed.files:
        assert f.old_path is None, f"{f.path}: the port patch must only create files (upstream code is never carried)"
        assert f.path.startswith("csrc/sm120/decode/dense/"), f.path
    assert {f.path.rsplit("/", 1)[-1] for f in parsed.files} >= {"splitkv_mla_mma.cuh", "splitkv_mla_mma.h", "bf16.cu", "fp16.cu"}


def test_the_wiring_patches_touch_only_the_dispatch_and_setup() -> None:
    assert parse_patch(SERIES / DISPATCH).paths == {"csrc/api/dense_decode.h", "csrc/api/api.cpp", "flash_mla/flash_mla_interface.py"}
    assert parse_patch(SERIES / SETUP).paths == {"setup.py"}
    assert parse_patch(SERIES / MSVC).paths == {"csrc/api/api.cpp"}


def test_port_entries_apply_everywhere_after_upstream_entries_and_the_msvc_fix_only_on_windows() -> None:
    series = load_series(SERIES)
    names = [e.name for e in series.entries]
    assert names.index(PORT) < names.index(DISPATCH) < names.index(SETUP) < names.index(MSVC)
    assert all(n < PORT for n in names[: names.index(PORT)])  # upstream fixes (0001, 0002, ...) come first
    linux = {e.name for e in series.select(PatchContext("linux-x86_64", ("sm_90a",)))}
    windows = {e.name for e in series.select(PatchContext("windows-amd64", ("sm_120a",)))}
    assert {PORT, DISPATCH, SETUP} <= linux and MSVC not in linux
    assert {PORT, DISPATCH, SETUP, MSVC} <= windows


def _added_device_code() -> list[str]:
    """The added lines of the port patch (our own CUDA sources)."""
    return [line[1:] for line in (SERIES / PORT).read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]


def test_the_port_source_is_msvc_safe() -> None:
    # Issue 13's Windows list: MSVC (the host compiler nvcc uses on Windows) has no __int128, and `long` is 32 bits
    # there, so a PTX "l" (64-bit) operand must be a 64-bit type. No MSVC here: this reads the source, which a
    # Windows build would otherwise be the first to find.


    code = _added_device_code()
    assert code, "the port patch adds no lines"
    assert not [line for line in code if "__int128" in line]
    bare_long = re.compile(r"\b(?<!long )long\b(?! long)(?! double)")
    assert not [line for line in code if bare_long.search(line.split("//", 1)[0])], "a bare `long` (32-bit on MSVC)"
    operands = [m.group(1) for line in code for m in re.finditer(r'"l"\((\w+)\)', line)]
    assert operands, "no 64-bit PTX operand found: the check would prove nothing"
    text = "\n".join(code)
    for name in operands:  # each "l" operand is declared as a 64-bit type in the port
        assert re.search(rf"\b(unsigned long long|long long|uint64_t|int64_t|size_t)\s+{name}\b", text), name
