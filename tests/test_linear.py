"""model/linear.py: the CPU product on each route (kernels.torch_cpu.capability), checked against
the rule it states: fp32 routes are IEEE fp32 products, the bf16 fp32-products route is the fp32
product of the upcast operands rounded once, the native route is torch's own bf16 kernel."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels.testing import assert_close
from kernels.torch_cpu.capability import forced_routes
from model.linear import EXACT_ROWS, ONEDNN_MIN_ROWS, Linear, _rows_padded, linear, native_half_matmuls, padded_rows

onednn = pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_linear_pointwise")
                            or not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _float64_product(x, w, b=None):
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


def test_bf16_product_is_the_fp32_product_of_the_upcast_operands_rounded_once():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((37, 48), (20, 48), (20,)))
    with forced_routes(bf16_matmul="fp32_products"):
        got = linear(x, w, b)
        with native_half_matmuls():  # PyTorch's own bf16 kernel: the same sums, another order
            native = linear(x, w, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, F.linear(x.float(), w.float(), b.float()).bfloat16())
    assert torch.equal(native, F.linear(x, w, b))
    assert torch.allclose(got.float(), native.float(), rtol=2 ** -6, atol=2 ** -6 * native.float().abs().max())


def test_bf16_native_route_is_torchs_bf16_kernel_within_bf16_tolerance_of_fp32():
    g = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((293, 96), (70, 96), (70,)))
    with forced_routes(bf16_matmul="native"):
        got = linear(x, w, b)
    assert got.dtype == torch.bfloat16 and torch.equal(got, F.linear(x, w, b))
    assert_close(got, _float64_product(x, w, b), torch.bfloat16, "bf16 native vs float64")


@onednn
@pytest.mark.parametrize("shape", [(ONEDNN_MIN_ROWS, 48), (3, 37, 48), (257, 130)])
def test_fp32_onednn_route_is_an_fp32_product(shape):
    """oneDNN's product against the float64 one at fp32's tolerance, and against MKL's to a few
    fp32 ulps of the sum's scale: no TF32/bf16 (those miss by ~1e-3 relative)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(*shape, generator=g)
    w, b = torch.randn(33, shape[-1], generator=g), torch.randn(33, generator=g)
    with forced_routes(fp32_matmul="onednn"):
        got = linear(x, w, b)
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 33)
    exact = _float64_product(x, w, b)
    assert_close(got, exact.float(), torch.float32, "fp32 oneDNN vs float64")
    scale = (x.double().abs() @ w.double().abs().T).max()
    assert float((got.double() - exact).abs().max()) <= 64 * 2**-24 * float(scale)


@onednn
def test_fp32_onednn_route_leaves_reduced_precision_settings_to_torch():
    """With torch's fp32 matmul precision lowered, the oneDNN route steps aside (F.linear, which
    follows the user's setting), and below ONEDNN_MIN_ROWS rows it is F.linear too."""
    g = torch.Generator().manual_seed(5)  # K = 1000: oneDNN's and MKL's sums differ in order here
    x, w = torch.randn(ONEDNN_MIN_ROWS - 1, 1000, generator=g), torch.randn(8, 1000, generator=g)
    big = torch.randn(64, 1000, generator=g)
    onednn_product = torch.ops.mkldnn._linear_pointwise(big, w, None, "none", [], "")
    assert not torch.equal(onednn_product, F.linear(big, w))  # else the checks below could not fail
    with forced_routes(fp32_matmul="onednn"):
        assert torch.equal(linear(x, w), F.linear(x, w))
        assert torch.equal(linear(big, w), onednn_product)
        prev = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("medium")
            assert torch.equal(linear(big, w), F.linear(big, w))
        finally:
            torch.set_float32_matmul_precision(prev)


def test_fp32_mkl_route_is_plain_f_linear():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(50, 8, generator=g), torch.randn(3, 8, generator=g)
    with forced_routes(fp32_matmul="mkl"):
        assert torch.equal(linear(x, w), F.linear(x, w))


def test_linear_module_keeps_nn_linears_parameters_and_keys():
    torch.manual_seed(2)
    ours, theirs = Linear(8, 4, bias=True), nn.Linear(8, 4, bias=True)
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight", "bias"}
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 8)
    assert torch.equal(ours(x), theirs(x))


@onednn
def test_training_keeps_autograd_on_the_onednn_route():
    torch.manual_seed(6)
    layer = Linear(16, 4)
    x = torch.randn(32, 16, requires_grad=True)
    with forced_routes(fp32_matmul="onednn"):
        layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_padded_rows_are_eight_sizes_an_octave_and_never_fewer_rows():
    sizes = [padded_rows(r) for r in range(1, 4097)]
    assert sizes[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))  # decode-sized products as they are
    for r, p in zip(range(1, 4097), sizes):
        assert r <= p <= r * 9 / 8, (r, p)
        assert padded_rows(p) == p  # a padded size is its own bucket
    for b in range(5, 12):  # rows in (2^b, 2^(b+1)]: 8 sizes, the octave's top included
        assert len({padded_rows(r) for r in range(2**b + 1, 2 ** (b + 1) + 1)}) == 8
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("shape", [(17, 40), (441, 96), (3, 67, 40)])
def test_products_run_on_padded_rows_and_return_the_real_ones(shape):
    """The rows reach the product padded with zero rows to `padded_rows`; the caller gets its own
    rows, in its own shape, equal to the unpadded product."""
    g = torch.Generator().manual_seed(shape[0])
    x = torch.randn(*shape, generator=g)
    w, b = torch.randn(24, shape[-1], generator=g), torch.randn(24, generator=g)
    seen = []

    def product(a, w_, b_):
        seen.append(a.clone())
        return F.linear(a, w_, b_)

    got = _rows_padded(product, x, w, b)
    rows = x.numel() // shape[-1]
    assert seen[0].shape == (padded_rows(rows), shape[-1]) and padded_rows(rows) > rows
    assert torch.equal(seen[0][:rows], x.reshape(rows, -1)) and not seen[0][rows:].any()
    assert got.shape == (*shape[:-1], 24)
    assert torch.allclose(got, F.linear(x, w, b), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("route", ["bf16_native", "fp32_onednn"])
def test_routes_pad_their_rows(route, monkeypatch):
    """Both oneDNN routes go through the padding (a kernel built per row count otherwise)."""
    import model.linear as linear_mod

    if route == "fp32_onednn" and not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        pytest.skip("torch built without oneDNN")
    calls = []
    inner = linear_mod._rows_padded
    monkeypatch.setattr(linear_mod, "_rows_padded", lambda *a: calls.append(a[1].shape) or inner(*a))
    dtype = torch.bfloat16 if route == "bf16_native" else torch.float32
    x, w = torch.randn(300, 64).to(dtype), torch.randn(32, 64).to(dtype)
    forced = dict(bf16_matmul="native") if route == "bf16_native" else dict(fp32_matmul="onednn")
    with torch.no_grad(), forced_routes(**forced):
        out = linear(x, w)
    assert calls == [(300, 64)] and out.shape == (300, 32)


@pytest.mark.parametrize("shape", [(1, 96), (1, 1, 96)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_one_row_half_product_is_a_matrix_vector_product(shape, with_bias, monkeypatch):
    """A decode step's one-row bf16 product on the native route goes through torch.mv / addmv (oneDNN's
    GEMM costs more per call there): the caller's shape, the bias added, within bf16's tolerance
    of the float64 product."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(*shape, generator=g).bfloat16()
    w, b = torch.randn(70, 96, generator=g).bfloat16(), torch.randn(70, generator=g).bfloat16()
    bias = b if with_bias else None
    calls = []
    mv, addmv = torch.mv, torch.addmv
    monkeypatch.setattr(torch, "mv", lambda *a: calls.append(a[1].shape) or mv(*a))
    monkeypatch.setattr(torch, "addmv", lambda *a: calls.append(a[2].shape) or addmv(*a))  # the bias fused
    with torch.no_grad(), forced_routes(bf16_matmul="native"):
        got = linear(x, w, bias)
    assert calls == [(96,)] and got.shape == (*shape[:-1], 70) and got.dtype == torch.bfloat16
    assert_close(got, _float64_product(x, w, bias).to(torch.bfloat16), torch.bfloat16, "one-row bf16 vs float64")
