"""CPU tests for the installed kforge_fmha: the library loads, is linked right, validates its
arguments with clear errors, and says clearly that there is no GPU. Runs in CI (no GPU).

Validation tests use torch tensors on the ``meta`` device (shapes and strides, no memory), and
a small fake DLPack producer that claims to be a CUDA array.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import kforge_fmha  # noqa: E402  (imported after torch: the custom op registers at import)
from kforge_fmha import (  # noqa: E402
    FmhaArgumentError,
    FmhaError,
    FmhaNoDeviceError,
    FmhaUnsupportedError,
)


def _has_gpu() -> bool:
    return torch.cuda.is_available()


# --- the library -----------------------------------------------------------------------------


def test_library_loads_and_reports_version() -> None:
    assert kforge_fmha.library_path().is_file()
    assert kforge_fmha.library_version() == kforge_fmha.__version__ == "0.1.0"


def test_built_archs_are_sm80_or_newer() -> None:
    archs = kforge_fmha.built_archs()
    assert archs, "the library reports no CUDA archs"
    for arch in archs:
        assert int("".join(ch for ch in arch if ch.isdigit())[:3].rstrip("0") or "0") >= 8, arch


def _elf():
    ELFFile = pytest.importorskip("elftools.elf.elffile").ELFFile  # noqa: N806

    f = open(kforge_fmha.library_path(), "rb")
    return f, ELFFile(f)


def test_no_undefined_cuda_register_linked_binary_symbols() -> None:
    f, elf = _elf()
    with f:
        dynsym = elf.get_section_by_name(".dynsym")
        assert dynsym is not None
        undefined = [s.name for s in dynsym.iter_symbols() if s["st_shndx"] == "SHN_UNDEF"]
    bad = [name for name in undefined if name.startswith("__cudaRegisterLinkedBinary")]
    assert not bad, f"undefined device-link symbols: {bad}"
    # The check itself must see symbols, or it proves nothing.
    assert undefined, "no undefined symbols at all: .dynsym was not read"


def test_cudart_is_static_and_only_the_api_is_exported() -> None:
    f, elf = _elf()
    with f:
        dynamic = elf.get_section_by_name(".dynamic")
        needed = [t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        dynsym = elf.get_section_by_name(".dynsym")
        exported = sorted(
            s.name for s in dynsym.iter_symbols()
            if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
            and s["st_info"]["type"] == "STT_FUNC"
        )
    assert not [n for n in needed if "cudart" in n], needed
    assert "kforge_fmha_fwd" in exported and "kforge_fmha_varlen_fwd" in exported
    leaked = [n for n in exported if not n.startswith("kforge_fmha_") and n not in ("_init", "_fini")]
    assert not leaked, f"symbols leaked from the static CUDA runtime: {leaked[:10]}"


def test_import_does_not_import_torch() -> None:
    code = "import sys, kforge_fmha; kforge_fmha.library_version(); print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


# --- no GPU ----------------------------------------------------------------------------------


@pytest.mark.skipif(_has_gpu(), reason="checks the behaviour on a machine without a GPU")
def test_device_check_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(FmhaNoDeviceError, match="NVIDIA") as info:
        kforge_fmha.device_check()
    assert "KFORGE_FMHA_ERROR_NO_DEVICE" in str(info.value)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = b"dltensor"


class FakeCudaArray:
    """A DLPack producer that claims CUDA memory at a fake address (never dereferenced)."""

    def __init__(self, shape: tuple[int, ...], code: int = 4, bits: int = 16,
                 address: int = 0x7F0000000000) -> None:
        from kforge_fmha import _tensor

        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*reversed(strides))
        t = _tensor._DLTensor(address, _tensor._DLDevice(2, 0), len(shape),
                              _tensor._DLDataType(code, bits, 1),
                              ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                              ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)), 0)
        self._managed = _tensor._DLManagedTensor(t, None, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, stream=None):
        return _PyCapsule_New(ctypes.addressof(self._managed), _CAPSULE_NAME, None)


@pytest.mark.skipif(_has_gpu(), reason="checks the behaviour on a machine without a GPU")
def test_valid_call_without_gpu_raises_no_device() -> None:
    q = FakeCudaArray((2, 128, 8, 64), address=0x7F0000000000)
    k = FakeCudaArray((2, 128, 2, 64), address=0x7F0010000000)
    v = FakeCudaArray((2, 128, 2, 64), address=0x7F0020000000)
    o = FakeCudaArray((2, 128, 8, 64), address=0x7F0030000000)
    with pytest.raises(FmhaNoDeviceError, match="NVIDIA"):
        kforge_fmha.fmha_fwd(q, k, v, out=o, causal=True)


def test_dlpack_producer_without_out_is_refused() -> None:
    q = FakeCudaArray((1, 16, 2, 64))
    with pytest.raises(FmhaArgumentError, match="pass out="):
        kforge_fmha.fmha_fwd(q, q, q)


def test_dlpack_float32_is_refused() -> None:
    q = FakeCudaArray((1, 16, 2, 64), code=2, bits=32)
    with pytest.raises(FmhaArgumentError, match="float32"):
        kforge_fmha.fmha_fwd(q, q, q, out=q)


# --- argument validation (meta tensors: shapes and strides without memory) -------------------


def meta(*shape: int, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_custom_op_is_registered_and_its_fake_gives_shapes() -> None:
    assert hasattr(torch.ops.kforge_fmha, "fwd")
    q, k = meta(2, 100, 8, 128), meta(2, 300, 2, 128)
    out, lse = kforge_fmha.fmha_fwd(q, k, k, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32


def test_torch_compile_traces_the_op_in_one_graph() -> None:
    def f(q, k, v):
        return kforge_fmha.fmha_fwd(q * 2.0, k, v, causal=True) + 1.0

    q = meta(2, 256, 4, 64)
    out = torch.compile(f, fullgraph=True, backend="eager")(q, q, q)
    assert out.shape == q.shape and out.device.type == "meta"


def test_varlen_fake_shapes() -> None:
    q, k = meta(57, 4, 64, dtype=torch.float16), meta(90, 1, 64, dtype=torch.float16)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    out, lse = kforge_fmha.fmha_varlen_fwd(q, k, k, cu, cu, 30, 40, return_lse=True)
    assert out.shape == (57, 4, 64) and lse.shape == (4, 57)


def test_cpu_tensor_is_refused() -> None:
    q = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(FmhaArgumentError, match=r"q is on cpu:0; .*CUDA"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_float32_is_refused() -> None:
    q = meta(1, 16, 2, 64, dtype=torch.float32)
    with pytest.raises(FmhaArgumentError, match="dtype float32.*float16 and bfloat16"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_mixed_dtypes_are_refused() -> None:
    q, k = meta(1, 16, 2, 64), meta(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(FmhaArgumentError, match="k has dtype float16 but q has bfloat16"):
        kforge_fmha.fmha_fwd(q, k, k)


def test_head_dim_96_is_unsupported() -> None:
    q = meta(1, 16, 2, 96)
    with pytest.raises(FmhaUnsupportedError, match="head_dim 96"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_wrong_rank_is_refused() -> None:
    q = meta(16, 2, 64)
    with pytest.raises(FmhaArgumentError, match=r"expected 4: \(batch, seqlen, num_heads, head_dim\)"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_gqa_heads_must_divide() -> None:
    q, k = meta(1, 16, 8, 64), meta(1, 16, 3, 64)
    with pytest.raises(FmhaArgumentError, match="8 heads and k/v have 3"):
        kforge_fmha.fmha_fwd(q, k, k)


def test_k_v_shapes_must_match() -> None:
    q, k, v = meta(1, 16, 2, 64), meta(1, 16, 2, 64), meta(1, 17, 2, 64)
    with pytest.raises(FmhaArgumentError, match="k has shape"):
        kforge_fmha.fmha_fwd(q, k, v)


def test_batch_must_match() -> None:
    q, k = meta(2, 16, 2, 64), meta(3, 16, 2, 64)
    with pytest.raises(FmhaArgumentError, match="q has batch 2 but k/v have 3"):
        kforge_fmha.fmha_fwd(q, k, k)


def test_non_contiguous_head_dim_is_refused() -> None:
    q = meta(1, 64, 2, 64).transpose(1, 3)  # head_dim now has stride 128
    with pytest.raises(FmhaArgumentError, match="last dimension .* not contiguous"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_unaligned_row_stride_is_refused() -> None:
    q = meta(1, 16, 1, 68)[..., :64]  # row stride 68 elements
    with pytest.raises(FmhaArgumentError, match="stride 68 in dimension 1"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_scale_must_be_positive() -> None:
    q = meta(1, 16, 2, 64)
    with pytest.raises(FmhaArgumentError, match="softmax_scale is -1.0"):
        kforge_fmha.fmha_fwd(q, q, q, softmax_scale=-1.0)


def test_varlen_cu_seqlens_must_be_int32() -> None:
    q = meta(40, 2, 64)
    cu = torch.empty(3, dtype=torch.int64, device="meta")
    with pytest.raises(FmhaArgumentError, match="cu_seqlens_q has dtype int64; it must be int32"):
        kforge_fmha.fmha_varlen_fwd(q, q, q, cu, cu, 20, 20)


def test_varlen_cu_seqlens_lengths_must_match() -> None:
    q = meta(40, 2, 64)
    cu3 = torch.empty(3, dtype=torch.int32, device="meta")
    cu4 = torch.empty(4, dtype=torch.int32, device="meta")
    with pytest.raises(FmhaArgumentError, match="cu_seqlens_q has 3 entries and cu_seqlens_k has 4"):
        kforge_fmha.fmha_varlen_fwd(q, q, q, cu3, cu4, 20, 20)


def test_varlen_needs_3d_tensors() -> None:
    q = meta(1, 40, 2, 64)
    cu = torch.empty(2, dtype=torch.int32, device="meta")
    with pytest.raises(FmhaArgumentError, match=r"expected 3: \(total_tokens"):
        kforge_fmha.fmha_varlen_fwd(q, q, q, cu, cu, 40, 40)


def test_not_a_tensor_is_refused() -> None:
    with pytest.raises(FmhaArgumentError, match="q is a list"):
        kforge_fmha.fmha_fwd([1, 2], [1], [1])


def test_none_is_a_type_error_naming_the_argument() -> None:
    with pytest.raises(TypeError, match=r"fmha_fwd\(\) needs q: a CUDA tensor"):
        kforge_fmha.fmha_fwd(None, None, None)
    q = torch.empty(1, 8, 2, 64, dtype=torch.float16, device="meta")
    with pytest.raises(TypeError, match=r"needs v"):
        kforge_fmha.fmha_fwd(q, q, None)
    with pytest.raises(TypeError, match=r"fmha_varlen_fwd\(\) needs cu_seqlens_k"):
        kforge_fmha.fmha_varlen_fwd(q[0], q[0], q[0], torch.empty(2, dtype=torch.int32, device="meta"), None, 8, 8)


def test_all_errors_share_a_base_class() -> None:
    assert issubclass(FmhaArgumentError, FmhaError) and issubclass(FmhaArgumentError, ValueError)
    assert issubclass(FmhaNoDeviceError, FmhaError)


# --- the C API directly, through ctypes --------------------------------------------------------


def test_c_api_validation_errors_have_text() -> None:
    from kforge_fmha import _lib

    lib = _lib.library()
    s = _lib.strides(128 * 8 * 64, 8 * 64, 64)
    fake = 0x7F0000000000
    status = lib.kforge_fmha_fwd(1, 64, fake, s, fake, s, fake, s, fake, s, None, None,
                                 2, 128, 128, 8, 3, 0.125, 0, None)
    assert status == 1
    assert b"not a multiple of num_heads_k" in lib.kforge_fmha_last_error()
    with pytest.raises(FmhaArgumentError, match="KFORGE_FMHA_ERROR_INVALID_ARGUMENT"):
        _lib.check(status)
    status = lib.kforge_fmha_fwd(1, 80, fake, s, fake, s, fake, s, fake, s, None, None,
                                 2, 128, 128, 8, 8, 0.125, 0, None)
    assert status == 2 and b"head_dim 80" in lib.kforge_fmha_last_error()


# --- the TMA kernel's barrier protocol (a model, no GPU) -------------------------------------


def test_tma_barrier_protocol_model_finds_no_deadlock_or_overwrite() -> None:
    """scripts/tma_protocol_model.py: the mbarrier rings of every mode, and the persistent
    variant's Q double buffer and cross-tile K/V ring, under random interleavings."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "tma_protocol_model.py"
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr


def test_sm90_backward_layout_model_matches_autograd() -> None:
    """scripts/sm90_bwd_model.py --quick: the sm_90a backward's swizzled tiles, wgmma descriptors
    and fragments, masks and dQ / dK / dV writes, replayed on the CPU, give autograd's gradients."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "sm90_bwd_model.py"
    res = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr


# --- the path table: one table (csrc/fmha_paths.def), and everything that lists it agrees ------

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tma_paths  # noqa: E402  (csrc/fmha_paths.def, parsed)


def test_library_path_list_is_the_table() -> None:
    """The C API's list (which the Python package reads) is the PATH rows, in order."""
    assert kforge_fmha.sm90_paths() == tma_paths.ALL_PATHS
    assert tma_paths.ALL_PATHS[:2] == ["default", "wgmma"]
    assert len(set(tma_paths.ALL_PATHS)) == len(tma_paths.ALL_PATHS)


def test_library_kernels_and_fallbacks_are_the_tables() -> None:
    for p in tma_paths.PATHS:
        for hd in (64, 128):
            if p.mode < 0:
                continue
            assert kforge_fmha.path_kernel(p.name, hd) == tma_paths.kernel_name(p.mode, p.var(hd)), (p, hd)
            row = next(v for v in tma_paths.VARS if v.var == p.var(hd))
            want = tma_paths.kernel_name(p.mode, row.no_counter) if row.no_counter >= 0 else ""
            assert kforge_fmha.path_fallback_kernel(p.name, hd) == want, (p, hd)
    assert kforge_fmha.path_kernel("wgmma", 128) == "sm90_wgmma"
    assert kforge_fmha.path_kernel("default", 64) == ""


def test_library_default_rule_is_the_table() -> None:
    for hd in (64, 128):
        for causal in (False, True):
            for sk in (0, 1, 2047, 2048, 2049, 4096, 4097, 8192, 8193, 1 << 20):
                assert kforge_fmha.default_path(hd, causal, sk) == tma_paths.default_path(hd, causal, sk)


def test_library_builds_exactly_the_kernels_its_option_says() -> None:
    """Without KFORGE_FMHA_TUNING_PATHS: a path runs at a head dim and mask exactly when its kernel
    is one the DEFAULT rows (with their fallbacks) reach; with it, every path everywhere."""
    tuning = kforge_fmha.tuning_paths_built()
    for path in tma_paths.ALL_PATHS:
        for hd in (64, 128):
            for causal in (False, True):
                want = tuning or tma_paths.lean_path_built(path, hd, causal)
                assert kforge_fmha.path_built(path, hd, causal) == want, (path, hd, causal, tuning)
    for d in tma_paths.DEFAULTS:  # the default always runs
        assert kforge_fmha.path_built(d.path, d.head_dim, d.causal)


def test_unknown_path_error_lists_every_path(monkeypatch) -> None:
    """The error text's list is the table's (checked before any CUDA call, so no GPU needed)."""
    from kforge_fmha import _lib

    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", "tmaa")
    lib = _lib.library()
    s = _lib.strides(128 * 8 * 64, 8 * 64, 64)
    fake = 0x7F0000000000
    status = lib.kforge_fmha_fwd(1, 64, fake, s, fake, s, fake, s, fake, s, None, None,
                                 2, 128, 128, 8, 8, 0.125, 0, None)
    msg = lib.kforge_fmha_last_error().decode()
    assert status == 1 and msg.startswith("KFORGE_FMHA_SM90_PATH is 'tmaa'; use "), msg
    listed = msg.split("; use ", 1)[1].rsplit(", or unset it", 1)[0]
    names = [n.strip().removesuffix(" (per shape)") for n in listed.replace(" or ", ", ").split(",")]
    assert names == tma_paths.ALL_PATHS


def test_readme_path_tables_are_generated_from_the_table() -> None:
    text = tma_paths.README.read_text()
    assert tma_paths.readme_with_block(text) == text, (
        "kernels/fmha/README.md's path tables differ from csrc/fmha_paths.def; run "
        "`python kernels/fmha/tests/tma_paths.py --write`")


def test_path_table_parser_reads_every_row() -> None:
    """Every line of fmha_paths.def that calls a row macro is read (a row the regex missed would
    leave the tests checking less than the library holds)."""
    text = tma_paths.PATHS_DEF.read_text()
    calls = [ln for ln in text.splitlines() if ln.startswith(("KFORGE_FMHA_VAR(", "KFORGE_FMHA_PATH(",
                                                              "KFORGE_FMHA_DEFAULT("))]
    assert len(calls) == len(tma_paths.VARS) + len(tma_paths.PATHS) + len(tma_paths.DEFAULTS)
    assert len(tma_paths.lean_kernels()) < len(tma_paths.tuning_kernels())
