"""model/linear.py: a half-precision product on the CPU computed in fp32 and rounded once."""

import torch
import torch.nn.functional as F
from torch import nn

from model.linear import Linear, linear, native_half_matmuls


def test_bf16_product_is_the_fp32_product_of_the_upcast_operands_rounded_once():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((37, 48), (20, 48), (20,)))
    got = linear(x, w, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, F.linear(x.float(), w.float(), b.float()).bfloat16())
    with native_half_matmuls():  # PyTorch's own bf16 kernel: the same sums, another order
        native = linear(x, w, b)
    assert torch.equal(native, F.linear(x, w, b))
    assert torch.allclose(got.float(), native.float(), rtol=2 ** -6, atol=2 ** -6 * native.float().abs().max())


def test_fp32_and_mixed_dtypes_are_plain_f_linear():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 8, generator=g), torch.randn(3, 8, generator=g)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_linear_module_keeps_nn_linears_parameters_and_keys():
    torch.manual_seed(2)
    ours, theirs = Linear(8, 4, bias=True), nn.Linear(8, 4, bias=True)
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight", "bias"}
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 8)
    assert torch.equal(ours(x), theirs(x))
