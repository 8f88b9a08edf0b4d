"""GPU tests for the installed kforge_fmha: correctness against
torch.nn.functional.scaled_dot_product_attention computed in fp32, and the failure modes users
hit on a GPU machine.

Kernel paths: on an H100/H200 with a 90a build, the accuracy tests run once per sm_90a path
(KFORGE_FMHA_SM90_PATH unset ("default": one TMA path per shape), wgmma and the TMA paths: the
PATH rows of csrc/fmha_paths.def, read by tma_paths.py) and check that the kernel that ran is
the one the library's table names for the path (kforge_fmha.path_kernel, default_path; or, for
calls a TMA path cannot take, the documented fallback). A path whose kernel at a test's head dim
and mask this library was built without (the wheel's build holds only what the default reaches;
-DKFORGE_FMHA_TUNING_PATHS=ON holds every path) is skipped with that reason, and
test_tuning_path_left_out_is_refused_clearly checks the error such a call gets. Elsewhere only
the default path runs; the other paths are skipped with the reason. KFORGE_FMHA_TEST_PATHS=wgmma,tma
(a comma list) limits the paths; the others are skipped with the reason.

Tolerance: the fp32 reference gets the same (rounded) fp16/bf16 inputs. Our error must be at
most twice the error of torch's own fp16/bf16 SDPA against that reference (with a small floor
per dtype), and below an absolute cap per dtype, so a broken reference cannot hide a bug.
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
import kforge_fmha  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from kforge_fmha import FmhaArgumentError, FmhaUnsupportedError  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
FLOOR = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
CAP = {torch.float16: 1e-2, torch.bfloat16: 6e-2}
LSE_ATOL = 2e-3


def _ids(dtype) -> str:
    return str(dtype).replace("torch.", "")


def reference(q, k, v, causal: bool, scale: float, dtype_of_lowp=None):
    """SDPA on (B, S, H, D) tensors with GQA expanded; returns (out fp32, lse fp32 (B, H, S)).

    Causal masks are bottom-right aligned, like kforge_fmha's.
    """
    h, hk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + (sk - sq)
    out = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), attn_mask=mask,
                                         scale=scale)
    s = torch.einsum("bhqd,bhkd->bhqk", qt.float(), kt.float()) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lowp = None
    if dtype_of_lowp is not None:
        lowp = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale).float()
        lowp = lowp.transpose(1, 2)
    return out.transpose(1, 2), lse, lowp


def assert_close(out, ref, lowp, dtype, what: str) -> None:
    err = (out.float() - ref).abs().max().item()
    torch_err = (lowp - ref).abs().nan_to_num(0).max().item() if lowp is not None else 0.0
    tol = min(max(2 * torch_err, FLOOR[dtype]), CAP[dtype])
    assert math.isfinite(err) and err <= tol, (
        f"{what}: max |out - ref| = {err:.3g} > tol {tol:.3g} (torch {dtype} SDPA error {torch_err:.3g})")


from tma_paths import ALL_PATHS  # noqa: E402  (csrc/fmha_paths.def, parsed; one table with scripts/tma_smoke.py)


def _chosen_paths() -> list[str]:
    chosen = os.environ.get("KFORGE_FMHA_TEST_PATHS")
    return [p for p in ALL_PATHS if not chosen or p in chosen.split(",")]


def _hopper_90a() -> bool:
    return (torch.cuda.get_device_capability() == (9, 0)
            and "90a" in kforge_fmha.built_archs())


@pytest.fixture(params=ALL_PATHS)
def sm90_path(request, monkeypatch) -> str:
    """Runs the test with KFORGE_FMHA_SM90_PATH set, or unset for "default" (the non-default
    paths only where they can run)."""
    path = request.param
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if path not in ("default", "wgmma") and not _hopper_90a():
        pytest.skip(f"the {path} path needs an sm_90 GPU (this is "
                    f"{torch.cuda.get_device_name()}) and a 90a build (built: {kforge_fmha.built_archs()})")
    if path == "default":
        monkeypatch.delenv("KFORGE_FMHA_SM90_PATH", raising=False)
    else:
        monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    return path


def expected_kernel(path: str, head_dim: int, varlen: bool = False, *, causal: bool,
                    seqlen_k: int) -> str:
    """The kernel kforge_fmha must report for a call on this GPU under `path`."""
    if not _hopper_90a() or os.environ.get("KFORGE_FMHA_SM90") == "0":
        return "mma_sync"
    if path != "wgmma" and not varlen:
        if path == "default":
            path = kforge_fmha.default_path(head_dim, causal, seqlen_k)
        return kforge_fmha.path_kernel(path, head_dim)
    return "sm90_wgmma" if head_dim == 128 else "mma_sync"  # the wgmma path and the TMA fallback


def need_built(path: str, head_dim: int, *causals: bool) -> None:
    """Skips the test, with the reason, when this library lacks the path's kernel at this head dim
    and mask (a tuning kernel: the build had KFORGE_FMHA_TUNING_PATHS off). Only where the path
    is used at all: an sm_90 GPU, a 90a build, KFORGE_FMHA_SM90 not 0."""
    if not _hopper_90a() or os.environ.get("KFORGE_FMHA_SM90") == "0":
        return
    for causal in causals:
        if not kforge_fmha.path_built(path, head_dim, causal):
            pytest.skip(f"path {path} at head dim {head_dim}, {'causal' if causal else 'non-causal'}: "
                        f"a tuning kernel ({kforge_fmha.path_kernel(path, head_dim)}) that this library "
                        "was built without (KFORGE_FMHA_TUNING_PATHS off, as in the wheel)")


def check_kernel(path: str, head_dim: int, varlen: bool = False, *, causal: bool,
                 seqlen_k: int) -> None:
    got = kforge_fmha.last_kernel()
    want = expected_kernel(path, head_dim, varlen, causal=causal, seqlen_k=seqlen_k)
    assert got == want, (f"path {path}, hdim {head_dim}, varlen={varlen}, causal={causal}, "
                         f"seqlen_k={seqlen_k}: ran {got!r}, expected {want!r}")


def rand(*shape, dtype, device="cuda"):
    return torch.randn(*shape, dtype=dtype, device=device)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("seqlen", [1, 17, 127, 1000, 4097])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_matches_sdpa(dtype, head_dim, causal, seqlen, sm90_path) -> None:
    need_built(sm90_path, head_dim, causal)
    batch, heads = (2, 4) if seqlen <= 1000 else (1, 2)
    q = rand(batch, seqlen, heads, head_dim, dtype=dtype)
    k = rand(batch, seqlen, heads, head_dim, dtype=dtype)
    v = rand(batch, seqlen, heads, head_dim, dtype=dtype)
    out, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, return_lse=True)
    check_kernel(sm90_path, head_dim, causal=causal, seqlen_k=seqlen)
    scale = 1.0 / math.sqrt(head_dim)
    ref, ref_lse, lowp = reference(q, k, v, causal, scale, dtype)
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, ref, lowp, dtype, f"{dtype} d={head_dim} causal={causal} L={seqlen}")
    assert (lse - ref_lse).abs().max().item() < LSE_ATOL


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads_k", [1, 2], ids=["mqa", "gqa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_gqa_and_mqa(dtype, heads_k, causal, head_dim, sm90_path) -> None:
    need_built(sm90_path, head_dim, causal)
    q = rand(2, 300, 8, head_dim, dtype=dtype)
    k = rand(2, 300, heads_k, head_dim, dtype=dtype)
    v = rand(2, 300, heads_k, head_dim, dtype=dtype)
    out = kforge_fmha.fmha_fwd(q, k, v, causal=causal)
    check_kernel(sm90_path, head_dim, causal=causal, seqlen_k=300)
    ref, _, lowp = reference(q, k, v, causal, head_dim ** -0.5, dtype)
    assert_close(out, ref, lowp, dtype, f"GQA 8/{heads_k}")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlens", [(5, 700), (300, 1), (64, 2000), (700, 300)], ids=str)
def test_kv_longer_or_shorter_than_q_causal_bottom_right(seqlens, head_dim, sm90_path) -> None:
    need_built(sm90_path, head_dim, True)
    sq, sk = seqlens
    dtype = torch.bfloat16
    q = rand(1, sq, 4, head_dim, dtype=dtype)
    k, v = rand(1, sk, 4, head_dim, dtype=dtype), rand(1, sk, 4, head_dim, dtype=dtype)
    out, lse = kforge_fmha.fmha_fwd(q, k, v, causal=True, return_lse=True)
    check_kernel(sm90_path, head_dim, causal=True, seqlen_k=sk)
    ref, ref_lse, lowp = reference(q, k, v, True, head_dim ** -0.5, dtype)
    visible = torch.arange(sq, device="cuda") + (sk - sq) >= 0  # rows that see at least one key
    assert_close(out[:, visible], ref[:, visible], lowp[:, visible], dtype, f"sq={sq} sk={sk}")
    assert torch.isfinite(lse[..., visible]).all()
    assert (lse[..., visible] - ref_lse[..., visible]).abs().max().item() < LSE_ATOL
    # Rows that see no key: O = 0, lse = -inf.
    assert (out[:, ~visible] == 0).all()
    assert torch.isneginf(lse[..., ~visible]).all()


def _pack(seqs):
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + s)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_varlen_mixes_short_and_long(dtype, head_dim, causal, sm90_path) -> None:
    need_built(sm90_path, head_dim, causal)
    lens_q = [1, 17, 1000, 127, 4097, 3]
    lens_k = [1, 17, 1000, 127, 4097, 3]
    if causal:  # decode steps against a KV cache next to prefills
        lens_k = [513, 17, 1000, 200, 4097, 64]
    h, hk = 8, 2
    cu_q, cu_k = _pack(lens_q), _pack(lens_k)
    q = rand(sum(lens_q), h, head_dim, dtype=dtype)
    k = rand(sum(lens_k), hk, head_dim, dtype=dtype)
    v = rand(sum(lens_k), hk, head_dim, dtype=dtype)
    out, lse = kforge_fmha.fmha_varlen_fwd(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                           causal=causal, return_lse=True)
    check_kernel(sm90_path, head_dim, varlen=True, causal=causal, seqlen_k=max(lens_k))  # TMA paths fall back
    assert lse.shape == (h, sum(lens_q))
    scale = head_dim ** -0.5
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k, strict=True)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        ref, ref_lse, lowp = reference(q[None, qs], k[None, ks], v[None, ks], causal, scale, dtype)
        assert_close(out[None, qs], ref, lowp, dtype, f"sequence {b} (q={sq}, k={sk})")
        assert (lse[:, qs] - ref_lse[0]).abs().max().item() < LSE_ATOL


@pytest.mark.parametrize("head_dim", [64, 128])
def test_strided_views_from_a_packed_qkv(head_dim, sm90_path) -> None:
    need_built(sm90_path, head_dim, True)
    dtype = torch.float16
    qkv = rand(2, 333, 3, 4, head_dim, dtype=dtype)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    out = kforge_fmha.fmha_fwd(q, k, v, causal=True)
    check_kernel(sm90_path, head_dim, causal=True, seqlen_k=333)
    ref, _, lowp = reference(q, k, v, True, head_dim ** -0.5, dtype)
    assert_close(out, ref, lowp, dtype, "packed qkv views")


def test_custom_softmax_scale(sm90_path) -> None:
    need_built(sm90_path, 128, False)
    dtype = torch.bfloat16
    q, k, v = (rand(1, 200, 2, 128, dtype=dtype) for _ in range(3))
    out = kforge_fmha.fmha_fwd(q, k, v, softmax_scale=0.3)
    check_kernel(sm90_path, 128, causal=False, seqlen_k=200)
    ref, _, lowp = reference(q, k, v, False, 0.3, dtype)
    assert_close(out, ref, lowp, dtype, "scale 0.3")


def test_torch_compile_calls_the_custom_op() -> None:
    dtype = torch.bfloat16
    q, k, v = (rand(2, 256, 4, 64, dtype=dtype) for _ in range(3))

    def f(q, k, v):
        return kforge_fmha.fmha_fwd(q * 2.0, k, v, causal=True) + 1.0

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)


def test_runs_on_torchs_current_stream_under_cuda_graph_capture(sm90_path) -> None:
    need_built(sm90_path, 128, True)
    # Capture fails if the kernel went to any stream but the capturing (current) one.
    dtype = torch.float16
    q, k, v = (rand(1, 512, 4, 128, dtype=dtype) for _ in range(3))
    expected = kforge_fmha.fmha_fwd(q, k, v, causal=True)
    check_kernel(sm90_path, 128, causal=True, seqlen_k=512)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kforge_fmha.fmha_fwd(q, k, v, causal=True)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kforge_fmha.fmha_fwd(q, k, v, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_dlpack_producer_cupy() -> None:
    cp = pytest.importorskip("cupy")
    dtype = torch.float16
    q, k, v = (rand(1, 100, 2, 64, dtype=dtype) for _ in range(3))
    expected = kforge_fmha.fmha_fwd(q, k, v)
    cq, ck, cv = (cp.from_dlpack(t) for t in (q, k, v))
    cout = cp.empty_like(cq)
    res = kforge_fmha.fmha_fwd(cq, ck, cv, out=cout)
    assert res is cout
    cp.cuda.runtime.deviceSynchronize()
    torch.testing.assert_close(torch.from_dlpack(cout), expected, atol=0, rtol=0)


def test_outputs_can_be_preallocated() -> None:
    dtype = torch.bfloat16
    q, k, v = (rand(2, 64, 2, 64, dtype=dtype) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(2, 2, 64, device="cuda")
    res = kforge_fmha.fmha_fwd(q, k, v, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    ref, ref_lse, lowp = reference(q, k, v, False, 0.125, dtype)
    assert_close(out, ref, lowp, dtype, "out=")


def test_peak_memory_is_linear_in_seqlen() -> None:
    dtype = torch.bfloat16
    peaks = []
    for seqlen in (4096, 16384):
        q, k, v = (rand(1, seqlen, 8, 128, dtype=dtype) for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kforge_fmha.fmha_fwd(q, k, v, causal=True, return_lse=True)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del q, k, v
    # Output + lse only: 4x the tokens must cost ~4x the bytes (an L^2 buffer would cost 16x).
    assert peaks[1] <= 4.5 * peaks[0], peaks
    assert peaks[1] < 16384 * 8 * 128 * 2 * 1.2, peaks


# --- failure modes users hit ----------------------------------------------------------------


def test_cpu_k_with_cuda_q_is_refused() -> None:
    q = rand(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(FmhaArgumentError, match="k is on cpu"):
        kforge_fmha.fmha_fwd(q, q.cpu(), q)


def test_misaligned_view_is_refused() -> None:
    base = rand(1 * 16 * 2 * 64 + 1, dtype=torch.float16)
    q = base[1:].view(1, 16, 2, 64)  # data pointer 2 bytes past an aligned address
    with pytest.raises(FmhaArgumentError, match="16-byte aligned"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_float32_cuda_is_refused() -> None:
    q = rand(1, 16, 2, 64, dtype=torch.float32)
    with pytest.raises(FmhaArgumentError, match="float32"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_head_dim_256_is_unsupported() -> None:
    q = rand(1, 16, 2, 256, dtype=torch.float16)
    with pytest.raises(FmhaUnsupportedError, match="head_dim 256"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_wrong_out_shape_is_refused() -> None:
    q = rand(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(FmhaArgumentError, match="out has shape"):
        kforge_fmha.fmha_fwd(q, q, q, out=torch.empty(1, 16, 2, 128, dtype=torch.float16, device="cuda"))


def test_c_api_refuses_host_pointers() -> None:
    from kforge_fmha import _lib

    host = torch.zeros(1, 16, 2, 64, dtype=torch.float16)
    lib = _lib.library()
    s = _lib.strides(16 * 2 * 64, 2 * 64, 64)
    p = host.data_ptr()
    status = lib.kforge_fmha_fwd(0, 64, p, s, p, s, p, s, p, s, None, None, 1, 16, 16, 2, 2,
                                 0.125, 0, None)
    assert status == 1 and b"host pointer" in lib.kforge_fmha_last_error()


def test_device_check_reports_the_gpu() -> None:
    major, minor = kforge_fmha.device_check()
    assert (major, minor) == torch.cuda.get_device_capability()


def test_custom_op_called_directly_matches_the_eager_path() -> None:
    dtype = torch.bfloat16
    q, k, v = (rand(2, 200, 4, 128, dtype=dtype) for _ in range(3))
    eager, eager_lse = kforge_fmha.fmha_fwd(q, k, v, causal=True, return_lse=True)
    op_out, op_lse = torch.ops.kforge_fmha.fwd(q, k, v, None, None, 200, 200, 128 ** -0.5, True)
    torch.testing.assert_close(op_out, eager, atol=0, rtol=0)
    torch.testing.assert_close(op_lse, eager_lse, atol=0, rtol=0)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_large_logits_whose_max_grows_late(dtype, causal, head_dim, sm90_path) -> None:
    need_built(sm90_path, head_dim, causal)
    # Key tiles run from the last to the first, so scores that grow towards key 0 make the
    # running max jump many times (the stale-max softmax must rescale O correctly), and logits
    # of +-100 check that nothing overflows.
    seqlen = 1500
    q = (rand(1, seqlen, 2, head_dim, dtype=torch.float32) * 3).to(dtype)
    ramp = torch.linspace(6.0, 0.1, seqlen, device="cuda")[None, :, None, None]
    k = (rand(1, seqlen, 2, head_dim, dtype=torch.float32) * ramp).to(dtype)
    v = rand(1, seqlen, 2, head_dim, dtype=dtype)
    out, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, return_lse=True)
    check_kernel(sm90_path, head_dim, causal=causal, seqlen_k=seqlen)
    ref, ref_lse, lowp = reference(q, k, v, causal, head_dim ** -0.5, dtype)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert_close(out, ref, lowp, dtype, "late-growing max")
    assert (lse - ref_lse).abs().max().item() < 5e-3 * max(1.0, ref_lse.abs().max().item() / 10)


def test_unknown_sm90_path_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", "tmaa")
    q = rand(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(FmhaArgumentError, match="KFORGE_FMHA_SM90_PATH is 'tmaa'"):
        kforge_fmha.fmha_fwd(q, q, q)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_one_process_switches_paths_between_calls(monkeypatch, head_dim) -> None:
    if not _hopper_90a():
        pytest.skip("needs an sm_90 GPU and a 90a build to have more than one path")
    q, k, v = (rand(2, 1000, 4, head_dim, dtype=torch.bfloat16) for _ in range(3))
    paths = [p for p in _chosen_paths() if kforge_fmha.path_built(p, head_dim, True)]
    if "wgmma" not in paths or len(paths) < 2:
        pytest.skip(f"KFORGE_FMHA_TEST_PATHS leaves {paths}: nothing to compare with wgmma")
    outs = {}
    for path in paths:
        monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
        outs[path] = kforge_fmha.fmha_fwd(q, k, v, causal=True)
        check_kernel(path, head_dim, causal=True, seqlen_k=1000)
    for path in paths:  # same inputs, different kernels: agree to within rounding
        if path != "wgmma":
            torch.testing.assert_close(outs[path], outs["wgmma"], atol=2e-2, rtol=0)


@pytest.mark.parametrize("section", ["1", "3", "1000"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("path", ["tma-lpt", "tma-pp-lpt", "tma-m192-lpt", "tma-persist", "tma-dyn",
                                  "tma-pp-dyn", "tma-dyn-xt", "tma-dyn-n176", "tma-pp-dyn-n176",
                                  "tma-dyn-skew", "tma-dyn-fe", "tma-dyn-ts",
                                  "tma-dyn-fs"])
def test_lpt_order_covers_every_tile(monkeypatch, path, head_dim, causal, section) -> None:
    """The 1-D longest-first grid of the lpt paths, with sections of 1 pair, of 3 pairs (the
    last one partial: 15 pairs) and of more pairs than there are (KFORGE_FMHA_LPT_SECTION):
    every (batch, head, m block) tile is computed once, so the output matches the reference."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip("the lpt paths need an sm_90 GPU and a 90a build")
    need_built(path, head_dim, causal)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    monkeypatch.setenv("KFORGE_FMHA_LPT_SECTION", section)
    q, k, v = (rand(3, 700, 5, head_dim, dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    kforge_fmha.fmha_fwd(q, k, v, causal=causal, out=out)
    check_kernel(path, head_dim, causal=causal, seqlen_k=700)
    ref, _, lowp = reference(q, k, v, causal, head_dim ** -0.5, torch.float16)
    assert torch.isfinite(out).all(), "a tile of the lpt grid was never written"
    assert_close(out, ref, lowp, torch.float16, f"{path} section={section}")


@pytest.mark.parametrize("path", ["tma-persist", "tma-dyn", "tma-pp-dyn", "tma-dyn-xt", "tma-dyn-n176",
                                  "tma-pp-dyn-n176", "tma-dyn-skew", "tma-dyn-n176-skew",
                                  "tma-pp-dyn-skew", "tma-dyn-fe", "tma-dyn-ts",
                                  "tma-dyn-fs"])
@pytest.mark.parametrize("seqlens", [(2100, 2100), (1000, 2100)], ids=["square", "q-shorter"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_persistent_kernel_walks_many_tiles(monkeypatch, head_dim, causal, seqlens, path) -> None:
    """The persistent paths with several tiles per CTA (4 x 8 pairs x 17 or 8 m blocks against one
    CTA per SM), so the Q double buffer and the K/V ring run on across tiles of different
    lengths. Three calls in a row: the dynamic paths' tile counter must be back at 0 after each
    launch, or the next launch would skip tiles (left NaN)."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    need_built(path, head_dim, causal)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    sq, sk = seqlens
    q = rand(4, sq, 8, head_dim, dtype=torch.bfloat16)
    k, v = (rand(4, sk, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    ref, ref_lse, lowp = reference(q, k, v, causal, head_dim ** -0.5, torch.bfloat16)
    for call in range(3):
        out = torch.full_like(q, float("nan"))
        _, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, out=out, return_lse=True)
        check_kernel(path, head_dim, causal=causal, seqlen_k=sk)
        assert torch.isfinite(out).all(), f"call {call}: a tile of the persistent walk was never written"
        assert_close(out, ref, lowp, torch.bfloat16, f"{path} {seqlens} causal={causal} call {call}")
        assert (lse - ref_lse).abs().max().item() < LSE_ATOL


@pytest.mark.parametrize("rem", [16, 64, 65, 112, 113, 176])
@pytest.mark.parametrize("path", ["tma-n176", "tma-dyn-n176", "tma-pp-dyn-n176", "tma-dyn-n176-skew"])
def test_176_key_tiles_with_partial_last_key_tile(monkeypatch, path, rem) -> None:
    """176-key tiles whose last key tile holds `rem` keys. Non-causal tma-dyn-n176 computes that
    tile's product only 64 (rem <= 64) or 112 (rem <= 112) keys wide (fmha_api.cpp picks the
    variant from seqlen_k): the keys on either side of each width's edge, with fewer query rows
    than keys (the tail m block partial too), and causal, where every tile is computed whole."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    need_built(path, 128, False, True)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    sk = 2 * 176 + rem
    q = rand(2, sk - 100, 6, 128, dtype=torch.bfloat16)
    k, v = (rand(2, sk, 6, 128, dtype=torch.bfloat16) for _ in range(2))
    for causal in (False, True):
        ref, ref_lse, lowp = reference(q, k, v, causal, 128 ** -0.5, torch.bfloat16)
        out = torch.full_like(q, float("nan"))
        _, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, out=out, return_lse=True)
        check_kernel(path, 128, causal=causal, seqlen_k=sk)
        assert torch.isfinite(out).all(), f"{path} rem={rem} causal={causal}: rows never written"
        assert_close(out, ref, lowp, torch.bfloat16, f"{path} rem={rem} causal={causal}")
        assert (lse - ref_lse).abs().max().item() < LSE_ATOL


@pytest.mark.parametrize("shape", [(64, 100, 100, 16, False), (64, 100, 100, 16, True),
                                   (8, 700, 300, 8, True), (4, 300, 700, 8, True)],
                         ids=["1-key-tile", "1-key-tile-causal", "rows-without-keys", "q-shorter"])
@pytest.mark.parametrize("path", ["tma-dyn", "tma-dyn-xt", "tma-dyn-skew", "tma-dyn-fe", "tma-dyn-ts",
                                  "tma-dyn-fs"])
def test_dynamic_tile_boundaries(monkeypatch, path, shape) -> None:
    """Many tiles per CTA whose key ranges differ at the tile boundary (which tma-dyn-xt carries a
    product across): tiles of one key tile (1024 tiles, so every boundary goes from a tile's last
    key tile straight to the next tile's first), causal tiles without any key (700 queries, 300
    keys: the first 400 rows see no key; they must come out 0 with LSE -inf) next to tiles with
    keys, and causal tiles of growing key ranges. Outputs and LSE against the reference on the
    rows that see keys."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    need_built(path, 128, shape[4])
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    batch, sq, sk, heads, causal = shape
    q = rand(batch, sq, heads, 128, dtype=torch.bfloat16)
    k, v = (rand(batch, sk, heads, 128, dtype=torch.bfloat16) for _ in range(2))
    ref, ref_lse, lowp = reference(q, k, v, causal, 128 ** -0.5, torch.bfloat16)
    seen = torch.isfinite(ref_lse)  # (B, H, S): rows that see at least one key
    rows = seen.transpose(1, 2)  # (B, S, H)
    for call in range(2):
        out = torch.full_like(q, float("nan"))
        _, lse = kforge_fmha.fmha_fwd(q, k, v, causal=causal, out=out, return_lse=True)
        check_kernel(path, 128, causal=causal, seqlen_k=sk)
        assert torch.isfinite(out).all(), f"{path} {shape} call {call}: rows never written"
        assert (out[~rows] == 0).all(), f"{path} {shape}: rows without keys are not 0"
        assert torch.isneginf(lse[~seen]).all(), f"{path} {shape}: rows without keys: LSE not -inf"
        assert_close(out[rows], ref[rows], lowp[rows], torch.bfloat16, f"{path} {shape} call {call}")
        assert (lse[seen] - ref_lse[seen]).abs().max().item() < LSE_ATOL


@pytest.mark.parametrize("layout", ["padded-rows", "heads-major", "wide-rows"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("path", ["tma-dyn-fe", "tma-dyn-ts", "tma-dyn-fs"])
def test_out_views_leave_the_memory_around_them(monkeypatch, path, head_dim, causal, layout) -> None:
    """out= as a view into a larger buffer filled with a sentinel: rows past seqlen_q in the same
    buffer ("padded-rows"), a (batch, heads, seqlen) buffer seen through a transpose with padded
    rows ("heads-major"), and rows twice as wide as head_dim ("wide-rows"). 1000 query rows leave
    the last tile 104 rows (the store of a partial tile: the TMA store of tma-dyn-ts and
    tma-dyn-fs clips it by its tensor map, tma-dyn-fe checks each row). Every element of out matches the reference, and
    every element of the buffer outside out keeps the sentinel."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    need_built(path, head_dim, causal)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    batch, sq, heads, sentinel = 2, 1000, 4, 7.0
    q, k, v = (rand(batch, sq, heads, head_dim, dtype=torch.bfloat16) for _ in range(3))
    if layout == "padded-rows":
        buf = torch.full((batch, sq + 77, heads, head_dim), sentinel, dtype=q.dtype, device="cuda")
        out = buf[:, :sq]
        inside = torch.zeros(buf.shape, dtype=torch.bool, device="cuda")
        inside[:, :sq] = True
    elif layout == "heads-major":
        buf = torch.full((batch, heads, sq + 77, head_dim), sentinel, dtype=q.dtype, device="cuda")
        out = buf[:, :, :sq].transpose(1, 2)
        inside = torch.zeros(buf.shape, dtype=torch.bool, device="cuda")
        inside[:, :, :sq] = True
    else:
        buf = torch.full((batch, sq, heads, 2 * head_dim), sentinel, dtype=q.dtype, device="cuda")
        out = buf[..., :head_dim]
        inside = torch.zeros(buf.shape, dtype=torch.bool, device="cuda")
        inside[..., :head_dim] = True
    assert not out.is_contiguous()
    res = kforge_fmha.fmha_fwd(q, k, v, causal=causal, out=out)
    assert res is out
    check_kernel(path, head_dim, causal=causal, seqlen_k=sq)
    ref, _, lowp = reference(q, k, v, causal, head_dim ** -0.5, torch.bfloat16)
    assert_close(out, ref, lowp, torch.bfloat16, f"{path} out view {layout}")
    assert (buf[~inside] == sentinel).all(), f"{path} {layout}: wrote outside out"


@pytest.mark.parametrize("path", ["tma-dyn", "tma-pp-dyn", "tma-dyn-xt", "tma-dyn-n176",
                                  "tma-pp-dyn-n176", "tma-dyn-skew", "tma-dyn-n176-skew",
                                  "tma-pp-dyn-skew", "tma-dyn-fe", "tma-dyn-ts",
                                  "tma-dyn-fs"])
def test_dynamic_paths_on_two_streams_at_once(monkeypatch, path) -> None:
    """Launches of a dynamic path on two streams may run at the same time: each stream has its own
    tile counter, so both outputs are whole and right (a shared counter would split the tiles
    between the two grids)."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    need_built(path, 128, True)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    ins = [tuple(rand(2, 3000, 8, 128, dtype=torch.float16) for _ in range(3)) for _ in range(2)]
    refs = [reference(q, k, v, True, 128 ** -0.5, torch.float16) for q, k, v in ins]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [[torch.full_like(ins[0][0], float("nan")) for _ in range(4)] for _ in range(2)]
    # The NaN fills run on the current stream, which the side streams do not wait for (they are
    # non-blocking): unsynchronized, a fill could land on an output after the kernel wrote it.
    torch.cuda.synchronize()
    for rep in range(4):
        for s in range(2):
            with torch.cuda.stream(streams[s]):
                q, k, v = ins[s]
                kforge_fmha.fmha_fwd(q, k, v, causal=True, out=outs[s][rep])
    torch.cuda.synchronize()
    for s in range(2):
        ref, _, lowp = refs[s]
        for rep in range(4):
            assert torch.isfinite(outs[s][rep]).all(), f"stream {s} call {rep}: tiles never written"
            assert_close(outs[s][rep], ref, lowp, torch.float16, f"{path} stream {s} call {rep}")


class _NewStream:
    """A non-blocking CUDA stream that no launch has used (torch.cuda.Stream() hands out pooled
    streams, which earlier tests may have used), from cudaStreamCreateWithFlags through the CUDA
    runtime torch loaded; destroyed on exit."""

    def __enter__(self) -> torch.cuda.ExternalStream:
        import ctypes

        try:
            self._rt = ctypes.CDLL(f"libcudart.so.{torch.version.cuda.split('.')[0]}")
        except OSError as e:
            pytest.skip(f"no CUDA runtime to make a new stream with: {e}")
        self._handle = ctypes.c_void_p()
        rc = self._rt.cudaStreamCreateWithFlags(ctypes.byref(self._handle), 1)  # cudaStreamNonBlocking
        assert rc == 0, f"cudaStreamCreateWithFlags: error {rc}"
        return torch.cuda.ExternalStream(self._handle.value)

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize()
        self._rt.cudaStreamDestroy(self._handle)


@pytest.mark.parametrize("path", ["tma-dyn-fs", "tma-dyn-n176"])
def test_dynamic_path_zeroes_a_new_streams_counter_in_its_order(monkeypatch, path) -> None:
    """A new stream's tile counter is zeroed in that stream's order, before its first launch. With
    the legacy default stream busy (a spinning kernel of about 2.5 launches' time), a memset there
    would land while the new non-blocking stream's launches run and reset the counter under one of
    them, and the launches after it would skip tiles, which stay NaN (H200, 2026-11-28: with the
    old memset this test or the two-stream one failed in 4 of 14 processes)."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    if torch.cuda.current_stream().cuda_stream != 0:
        pytest.skip("torch's current stream is not the legacy default stream")
    need_built(path, 128, True)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    q, k, v = (rand(2, 8192, 16, 128, dtype=torch.bfloat16) for _ in range(3))
    base = kforge_fmha.fmha_fwd(q, k, v, causal=True)
    assert torch.isfinite(base).all()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kforge_fmha.fmha_fwd(q, k, v, causal=True, out=torch.empty_like(q))
    end.record()
    torch.cuda.synchronize()
    launch_ms = start.elapsed_time(end)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles = int(1_000_000 * 2.5 * launch_ms / start.elapsed_time(end))
    outs = [torch.full_like(q, float("nan")) for _ in range(6)]
    torch.cuda.synchronize()  # the fills first: the new stream does not wait for this one
    with _NewStream() as stream:
        torch.cuda._sleep(cycles)  # on the legacy default stream
        with torch.cuda.stream(stream):
            for out in outs:
                kforge_fmha.fmha_fwd(q, k, v, causal=True, out=out)
    for i, out in enumerate(outs):
        assert torch.isfinite(out).all(), f"launch {i} on the new stream: tiles never written"
        assert torch.equal(out, base), f"launch {i} on the new stream differs from the first one"


@pytest.mark.parametrize("path", ["tma-dyn", "tma-pp-dyn", "tma-dyn-xt", "tma-dyn-n176",
                                  "tma-pp-dyn-n176", "tma-dyn-skew", "tma-dyn-n176-skew",
                                  "tma-pp-dyn-skew", "tma-dyn-fe", "tma-dyn-ts",
                                  "tma-dyn-fs"])
def test_dynamic_paths_fall_back_in_graph_capture(monkeypatch, path) -> None:
    """In a CUDA graph the dynamic paths take the static kernel of their mode (lpt order; the
    176-key ones the static 176-key kernel): a graph can be replayed on any stream, so no stream's
    counter is safe to bake in. The replays are right."""
    if path not in _chosen_paths():
        pytest.skip(f"path {path} is not in KFORGE_FMHA_TEST_PATHS={os.environ.get('KFORGE_FMHA_TEST_PATHS')}")
    if not _hopper_90a():
        pytest.skip(f"{path} needs an sm_90 GPU and a 90a build")
    need_built(path, 128, True)
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    q, k, v = (rand(2, 1500, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    kforge_fmha.fmha_fwd(q, k, v, causal=True, out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            kforge_fmha.fmha_fwd(q, k, v, causal=True, out=out)
    lpt = kforge_fmha.path_fallback_kernel(path, 128)  # the table's NO_COUNTER kernel
    assert lpt, f"{path} has no dynamic scheduler, so no fallback to check"
    assert kforge_fmha.last_kernel() == lpt
    ref, _, lowp = reference(q, k, v, True, 128 ** -0.5, torch.bfloat16)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, ref, lowp, torch.bfloat16, f"{path} graph replay")


def test_bad_lpt_section_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("KFORGE_FMHA_LPT_SECTION", "0")
    q = rand(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(FmhaArgumentError, match="KFORGE_FMHA_LPT_SECTION is '0'"):
        kforge_fmha.fmha_fwd(q, q, q)


def test_tuning_path_left_out_is_refused_clearly(monkeypatch) -> None:
    """In a build without KFORGE_FMHA_TUNING_PATHS (the wheel's), a path whose kernel at the call's
    head dim and mask is a tuning kernel is refused with KFORGE_FMHA_ERROR_UNSUPPORTED and a
    message that names the path and the build option; nothing launches, and the default still
    runs afterwards."""
    if not _hopper_90a() or os.environ.get("KFORGE_FMHA_SM90") == "0":
        pytest.skip("the sm_90a paths are used only on an sm_90 GPU with a 90a build")
    if kforge_fmha.tuning_paths_built():
        pytest.skip("this library was built with KFORGE_FMHA_TUNING_PATHS: every path is in it")
    left_out = [(p, d, c) for p in ALL_PATHS for d in (64, 128) for c in (False, True)
                if not kforge_fmha.path_built(p, d, c)]
    assert left_out, "a build without the tuning paths left no path out"
    path, head_dim, causal = left_out[0]
    monkeypatch.setenv("KFORGE_FMHA_SM90_PATH", path)
    q = rand(1, 300, 2, head_dim, dtype=torch.bfloat16)
    with pytest.raises(FmhaUnsupportedError, match=f"path {path} is a tuning path.*built without "
                                                   "KFORGE_FMHA_TUNING_PATHS"):
        kforge_fmha.fmha_fwd(q, q, q, causal=causal)
    monkeypatch.delenv("KFORGE_FMHA_SM90_PATH")
    out = kforge_fmha.fmha_fwd(q, q, q, causal=causal)
    check_kernel("default", head_dim, causal=causal, seqlen_k=300)
    assert torch.isfinite(out).all()
