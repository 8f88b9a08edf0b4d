"""CPU tests of kforge_fmha.attention / varlen_attention (no GPU): the package imports without
torch, the custom ops and their fake implementations give the shapes of out and of the
gradients, a torch.compile(fullgraph=True) training step holds both ops in one graph, argument
errors are clear, and without a GPU a valid call reaches the C library through ctypes (which
answers NO_DEVICE once every argument has passed its checks).

Shapes and strides use torch ``meta`` tensors (no memory); the ctypes test relabels CPU tensors
as CUDA ones so the Python checks pass and the library's own checks run.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import kforge_fmha  # noqa: E402
from kforge_fmha import FmhaArgumentError, FmhaError, FmhaNoDeviceError, FmhaUnsupportedError  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

PAIRS = [(64, 64), (128, 128), (192, 128), (128, 192)]


def meta(*shape: int, dtype=torch.bfloat16, grad: bool = True):
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)


class OpLog(TorchDispatchMode):
    """Records the kforge_fmha ops that run, with their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "kforge_fmha":
            self.calls.append((func._opname, args))
        return func(*args, **(kwargs or {}))


# --- import without torch ---------------------------------------------------------------------


def test_import_and_attribute_access_do_not_import_torch() -> None:
    code = ("import sys, kforge_fmha; f = kforge_fmha.attention, kforge_fmha.varlen_attention; "
            "print('torch' in sys.modules, 'kforge_fmha._autograd' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["False", "False"]


def test_attention_without_torch_installed_says_so() -> None:
    code = ("import sys\n"
            "class NoTorch:\n"  # a finder that makes `import torch` fail, as if not installed
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'torch':\n"
            "            raise ImportError('No module named torch')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import kforge_fmha\n"
            "try:\n    kforge_fmha.attention(1, 2, 3)\n"
            "except kforge_fmha.FmhaError as e:\n    print(e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "need torch" in res.stdout and "fmha_fwd" in res.stdout


def test_exported() -> None:
    assert {"attention", "varlen_attention"} <= set(kforge_fmha.__all__)


# --- shapes through the ops (meta tensors) -------------------------------------------------------


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_shapes_of_out_and_gradients(pair) -> None:
    d_qk, d_v = pair
    q, k, v = meta(2, 100, 8, d_qk), meta(2, 300, 2, d_qk), meta(2, 300, 2, d_v)
    out = kforge_fmha.attention(q, k, v, causal=True)
    assert out.shape == (2, 100, 8, d_v) and out.dtype == q.dtype and out.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_varlen_shapes_of_out_and_gradients(pair) -> None:
    d_qk, d_v = pair
    q, k, v = meta(57, 4, d_qk), meta(90, 1, d_qk), meta(90, 1, d_v)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    out = kforge_fmha.varlen_attention(q, k, v, cu, cu, 30, 40)
    assert out.shape == (57, 4, d_v)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_ops_get_the_arguments_the_kernels_need() -> None:
    """The forward op gets the resolved scale (1/sqrt(d_qk)), the sequence lengths and the
    deterministic flag; the backward op gets dout, the saved tensors and the same values."""
    q, k, v = meta(2, 100, 8, 192), meta(2, 300, 2, 192), meta(2, 300, 2, 128)
    with OpLog() as log:
        out = kforge_fmha.attention(q, k, v, causal=True, deterministic=True)
        out.sum().backward()
    names = [n for n, _ in log.calls]
    assert names == ["attn_fwd", "attn_bwd"], names
    fwd_args, bwd_args = log.calls[0][1], log.calls[1][1]
    assert fwd_args[3:] == (None, None, 100, 300, pytest.approx(192 ** -0.5), True, True)
    assert bwd_args[0].shape == out.shape  # dout
    assert bwd_args[6:] == (None, None, 100, 300, pytest.approx(192 ** -0.5), True, True)


def test_deterministic_follows_torchs_switch_when_not_given() -> None:
    q = meta(1, 16, 2, 64)
    for flag in (True, False):
        torch.use_deterministic_algorithms(flag)
        try:
            with OpLog() as log:
                kforge_fmha.attention(q, q, q).sum().backward()
        finally:
            torch.use_deterministic_algorithms(False)
        assert log.calls[0][1][-1] is flag and log.calls[1][1][-1] is flag


def test_softmax_scale_is_passed_on() -> None:
    q = meta(1, 16, 2, 64)
    with OpLog() as log:
        kforge_fmha.attention(q, q, q, softmax_scale=0.3)
    assert log.calls[0][1][7] == pytest.approx(0.3)


def test_lse_output_of_the_op_is_not_differentiable() -> None:
    q = meta(1, 16, 2, 64)
    out, lse = torch.ops.kforge_fmha.attn_fwd(q, q, q, None, None, 16, 16, 0.125, False, False)
    assert out.requires_grad and not lse.requires_grad
    assert lse.shape == (1, 2, 16) and lse.dtype == torch.float32


def test_compile_fullgraph_training_step_holds_both_ops() -> None:
    """A training step (projections, attention, loss) compiled with fullgraph=True: one graph,
    the forward graph calls attn_fwd and the backward graph attn_bwd."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.testing import CompileCounterWithBackend

    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm.code
            return gm.forward
        return compiler

    backend = CompileCounterWithBackend(aot_autograd(fw_compiler=keep("fwd"), bw_compiler=keep("bwd")))
    w = torch.empty(64, 3 * 64, dtype=torch.bfloat16, device="meta", requires_grad=True)

    def step(x):
        q, k, v = (x @ w).view(2, 128, 3, 1, 64).unbind(2)
        out = kforge_fmha.attention(q, k, v, causal=True)
        return out.float().square().mean()

    x = meta(2, 128, 64, grad=False)
    loss = torch.compile(step, fullgraph=True, backend=backend)(x)
    loss.backward()
    assert backend.frame_count == 1
    assert "torch.ops.kforge_fmha.attn_fwd" in graphs["fwd"]
    assert "torch.ops.kforge_fmha.attn_bwd" in graphs["bwd"]
    assert w.grad.shape == w.shape


def test_compile_varlen_fullgraph() -> None:
    q, k, v = meta(57, 4, 192), meta(90, 1, 192), meta(90, 1, 128)
    cu = torch.empty(4, dtype=torch.int32, device="meta")

    def f(q, k, v):
        return kforge_fmha.varlen_attention(q, k, v, cu, cu, 30, 40, causal=True).float().sum()

    torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v).backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


# --- argument errors -------------------------------------------------------------------------------


def test_float32_is_refused_with_a_fix() -> None:
    q = meta(1, 16, 2, 64, dtype=torch.float32)
    with pytest.raises(FmhaArgumentError, match="float16 and bfloat16.*autocast"):
        kforge_fmha.attention(q, q, q)


def test_unsupported_pair_is_refused() -> None:
    q, v = meta(1, 16, 2, 64), meta(1, 16, 2, 128)
    with pytest.raises(FmhaUnsupportedError, match=r"\(64, 128\) has no kernel.*\(192, 128\)"):
        kforge_fmha.attention(q, q, v)


def test_k_and_v_must_agree_but_in_head_dim() -> None:
    q, k, v = meta(1, 16, 2, 192), meta(1, 16, 2, 192), meta(1, 17, 2, 128)
    with pytest.raises(FmhaArgumentError, match="every dimension but the last"):
        kforge_fmha.attention(q, k, v)


def test_k_head_dim_must_be_qs() -> None:
    q, k, v = meta(1, 16, 2, 192), meta(1, 16, 2, 128), meta(1, 16, 2, 128)
    with pytest.raises(FmhaArgumentError, match="k's head_dim is 128 but q's is 192"):
        kforge_fmha.attention(q, k, v)


def test_gqa_heads_must_divide() -> None:
    q, k = meta(1, 16, 8, 64), meta(1, 16, 3, 64)
    with pytest.raises(FmhaArgumentError, match="8 heads and k/v have 3"):
        kforge_fmha.attention(q, k, k)


def test_misaligned_stride_is_refused() -> None:
    q = meta(1, 16, 1, 68)[..., :64]
    with pytest.raises(FmhaArgumentError, match="stride 68"):
        kforge_fmha.attention(q, q, q)


def test_varlen_needs_int32_cu_seqlens() -> None:
    q = meta(40, 2, 64)
    cu = torch.empty(3, dtype=torch.int64, device="meta")
    with pytest.raises(FmhaArgumentError, match="int64; it must be int32"):
        kforge_fmha.varlen_attention(q, q, q, cu, cu, 20, 20)


def test_none_and_non_tensors_are_refused() -> None:
    q = meta(1, 16, 2, 64)
    with pytest.raises(TypeError, match=r"attention\(\) needs v"):
        kforge_fmha.attention(q, q, None)
    with pytest.raises(TypeError, match=r"varlen_attention\(\) needs cu_seqlens_k"):
        kforge_fmha.varlen_attention(q[0], q[0], q[0], torch.empty(2, dtype=torch.int32), None, 8, 8)
    with pytest.raises(FmhaArgumentError, match="k is a list.*torch tensors"):
        kforge_fmha.attention(q, [1], q)


def test_cpu_tensors_are_refused() -> None:
    q = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(FmhaArgumentError, match="q is on cpu"):
        kforge_fmha.attention(q, q, q)


# --- the ctypes path, without a GPU ---------------------------------------------------------------


@pytest.fixture()
def cpu_as_cuda(monkeypatch):
    """CPU tensors described as CUDA ones (the Python checks then pass); stream 0."""
    from kforge_fmha import _api, _autograd, _tensor

    real = _tensor.describe

    def describe(name, x, stream=None):
        return dataclasses.replace(real(name, x, stream), device_type="cuda")

    monkeypatch.setattr(_autograd, "describe", describe)
    monkeypatch.setattr(_api, "describe", describe)
    monkeypatch.setattr(_api, "torch_stream", lambda index: 0)
    return _autograd


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without a GPU")
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_valid_calls_reach_the_library_and_get_no_device(cpu_as_cuda, pair) -> None:
    """forward_torch (kforge_fmha_fwd_v2 / varlen_fwd_v2) and backward_torch (through bwd_torch:
    kforge_fmha_bwd / varlen_bwd) with every pair, GQA, strided views: the library checks every
    argument before its first CUDA call, so NO_DEVICE means the ctypes call was well formed."""
    d_qk, d_v = pair
    packed = torch.zeros(2, 100, 8 * d_qk + 2 * (d_qk + d_v), dtype=torch.bfloat16)
    q = packed[..., :8 * d_qk].unflatten(-1, (8, d_qk))
    k = packed[..., 8 * d_qk:10 * d_qk].unflatten(-1, (2, d_qk))
    v = packed[..., 10 * d_qk:].unflatten(-1, (2, d_v))
    with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
        cpu_as_cuda.forward_torch(q, k, v, None, None, None, None, None, True)
    out, lse = torch.zeros(2, 100, 8, d_v, dtype=torch.bfloat16), torch.zeros(2, 8, 100)
    dout = torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16).expand(2, 100, 8, d_v)  # made contiguous
    with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
        cpu_as_cuda.backward_torch(dout, q, k, v, out, lse, None, None, None, None, 0.1, True, False)
    qv, kv, vv = (t.flatten(0, 1) for t in (q, k, v))
    cu = torch.tensor([0, 37, 200], dtype=torch.int32)
    with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
        cpu_as_cuda.forward_torch(qv, kv, vv, cu, cu, 163, 163, None, False)
    with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
        cpu_as_cuda.backward_torch(out.flatten(0, 1), qv, kv, vv, out.flatten(0, 1),
                                   torch.zeros(8, 200), cu, cu, 163, 163, 0.1, False, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without a GPU")
def test_backward_path_variable_is_checked_before_the_device(cpu_as_cuda, monkeypatch) -> None:
    """KFORGE_FMHA_BWD_PATH: "sm90" refuses the pairs the sm_90a backward lacks (or a build without
    90a) before any CUDA call; it takes (64, 64) and (128, 128), and every pair in the
    deterministic mode (the portable kernels run it on every path); an unknown value is an
    argument error. Calls that pass these checks get NO_DEVICE here."""

    def bwd(d_qk, d_v, deterministic=False):
        q, k = torch.zeros(1, 64, 2, d_qk, dtype=torch.float16), torch.zeros(1, 64, 2, d_qk, dtype=torch.float16)
        v, out = torch.zeros(1, 64, 2, d_v, dtype=torch.float16), torch.zeros(1, 64, 2, d_v, dtype=torch.float16)
        return cpu_as_cuda.backward_torch(out, q, k, v, out, torch.zeros(1, 2, 64), None, None, None, None,
                                          0.1, True, deterministic)

    has_90a = "90a" in kforge_fmha.built_archs()
    monkeypatch.setenv("KFORGE_FMHA_BWD_PATH", "sm90")
    for pair in [(64, 64), (128, 128)]:
        if has_90a:
            with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
                bwd(*pair)
        else:
            with pytest.raises(FmhaUnsupportedError, match="without 90a"):
                bwd(*pair)
    for pair in [(192, 128), (128, 192)]:
        why = r"\(64, 64\) and \(128, 128\) only, not \(%d, %d\)" % pair if has_90a else "without 90a"
        with pytest.raises(FmhaUnsupportedError, match=why):
            bwd(*pair)
        with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
            bwd(*pair, deterministic=True)
    for value in ["default", "portable", ""]:
        monkeypatch.setenv("KFORGE_FMHA_BWD_PATH", value)
        with pytest.raises(FmhaNoDeviceError, match="NO_DEVICE"):
            bwd(192, 128)
    monkeypatch.setenv("KFORGE_FMHA_BWD_PATH", "fast")
    with pytest.raises(FmhaArgumentError, match="KFORGE_FMHA_BWD_PATH is 'fast'"):
        bwd(128, 128)


def test_empty_batches_need_no_library_call(cpu_as_cuda, monkeypatch) -> None:
    """No query rows: empty outputs; no keys: out 0 and lse -inf; zero gradients. The C API takes
    no NULL pointers, so these never reach it."""
    from kforge_fmha import _lib

    monkeypatch.setattr(_lib, "library", lambda: pytest.fail("the library was called"))
    q, k = torch.zeros(2, 0, 4, 64, dtype=torch.float16), torch.zeros(2, 9, 4, 64, dtype=torch.float16)
    out, lse = cpu_as_cuda.forward_torch(q, k, k, None, None, None, None, None, False)
    assert out.shape == (2, 0, 4, 64) and lse.shape == (2, 4, 0)
    q, k = torch.zeros(2, 5, 4, 64, dtype=torch.float16), torch.zeros(2, 0, 4, 64, dtype=torch.float16)
    out, lse = cpu_as_cuda.forward_torch(q, k, k, None, None, None, None, None, True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    grads = cpu_as_cuda.backward_torch(torch.ones_like(out), q, k, k, out, lse, None, None, None,
                                       None, 0.125, True, False)
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape] and (grads[0] == 0).all()


def test_errors_derive_from_fmha_error() -> None:
    assert issubclass(FmhaArgumentError, FmhaError)
