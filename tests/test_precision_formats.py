"""Storage formats: bit layouts against hand-computed values, rounding rules, error bounds, stochastic rounding."""

import pytest
import torch

from hf_replayssm.precision.formats import (
    E2M1_GRID,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    get_format,
    pack_nibbles,
    stochastic_round,
    unpack_nibbles,
)


def test_e2m1_grid_and_codes():
    grid = torch.tensor(E2M1_GRID)
    assert E2M1_GRID == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert e2m1_encode(grid).tolist() == list(range(8))
    assert e2m1_encode(-grid[1:]).tolist() == list(range(9, 16))  # sign is bit 3
    assert torch.equal(e2m1_decode(torch.arange(16, dtype=torch.uint8)), torch.cat([grid, -grid]))


def test_e2m1_round_to_nearest_even():
    # midpoints go to the neighbour with the even code (mantissa bit 0)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    near = torch.tensor([0.26, 0.74, 1.3, 2.49, 2.51, 4.9, 5.1, 7.0, 1e9, -0.2, -5.5])
    assert e2m1_decode(e2m1_encode(near)).tolist() == [0.5, 0.5, 1.5, 2.0, 3.0, 4.0, 6.0, 6.0, 6.0, 0.0, -6.0]


def test_nibble_packing_order():
    codes = torch.tensor([1, 2, 3, 4, 15, 0], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [0x21, 0x43, 0x0F]  # element 2i in the low nibble
    assert torch.equal(unpack_nibbles(packed), codes)


def test_e4m3_bits():
    values = torch.tensor([1.0, 1.0625, 1.1875, 448.0, 1000.0, 2.0**-9, 2.0**-11, -2.0, 0.0])
    # 1.0625 ties between 1.0 (mantissa 0) and 1.125 (mantissa 1): even -> 1.0; 1.1875 -> 1.25 (mantissa 2)
    assert e4m3_encode(values).tolist() == [0x38, 0x38, 0x3A, 0x7E, 0x7E, 0x01, 0x00, 0xC0, 0x00]
    assert e4m3_decode(torch.tensor([0x38, 0x3A, 0x7E, 0x01], dtype=torch.uint8)).tolist() == [
        1.0, 1.25, 448.0, 2.0**-9]


def test_nvfp4_hand_computed_block():
    v = torch.tensor([6, -3, 1.5, 0.5, 0, 0.25, 0.75, 1.25, 2.5, 5, 4, 1, 2, 3.5, -6, 0])
    x = (v * 448 / 512).view(1, 1, 16)  # block amax 6*448/512
    fmt = get_format("nvfp4")
    enc = fmt.encode(x)
    # tensor scale = amax / (6*448) = 1/512; block scale = amax / 6 / (1/512) = 448 -> E4M3 0x7E; x / (448/512) = v
    assert enc["tensor_scale"].tolist() == [1 / 512]
    assert enc["block_scale"].flatten().tolist() == [0x7E]
    # codes 7,13 | 3,1 | 0,0 | 2,2 | 4,6 | 6,2 | 4,6 | 15,0  (ties 0.25->0, 0.75->1, 1.25->1, 2.5->2, 5->4, 3.5->4)
    assert enc["packed"].flatten().tolist() == [0xD7, 0x13, 0x00, 0x22, 0x64, 0x26, 0x64, 0x0F]
    expected = torch.tensor([6, -3, 1.5, 0.5, 0, 0, 1, 1, 2, 4, 4, 1, 2, 4, -6, 0]) * 448 / 512
    assert torch.equal(fmt.decode(enc).flatten(), expected)


def test_nvfp4_layout_and_error_bound():
    x = torch.randn(3, 4, 8, 40) * torch.logspace(-3, 2, 40)  # rows of 40: padded to 48 = 3 blocks
    fmt = get_format("nvfp4")
    enc = fmt.encode(x)
    assert enc["packed"].shape == (3, 4, 8, 24) and enc["packed"].dtype == torch.uint8
    assert enc["block_scale"].shape == (3, 4, 8, 3) and enc["tensor_scale"].shape == (3,)
    err = (fmt.decode(enc) - x).abs()
    padded = torch.nn.functional.pad(x, (0, 8)).unflatten(-1, (3, 16)).abs().amax(-1, keepdim=True)
    block_amax = padded.expand(-1, -1, -1, -1, 16).flatten(-2)[..., :40]
    floor = x.abs().flatten(1).amax(1).view(3, 1, 1, 1) / (6 * 448) * 2.0**-9
    assert (err <= (1 + 2**-4) / 6 * block_amax + floor).all()
    assert fmt.bytes_per_element(128) == 0.5625


def test_fp8_row_scaling_and_error_bound():
    x = torch.randn(2, 3, 5, 64) * torch.logspace(-4, 1, 64)
    fmt = get_format("fp8")
    enc = fmt.encode(x)
    assert enc["codes"].dtype == torch.uint8 and enc["scale"].shape == (2, 3, 5, 1)
    amax = x.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(enc["scale"], amax / 448)
    err = (fmt.decode(enc) - x).abs()
    assert (err <= torch.maximum(x.abs() * 2.0**-4, amax / 448 * 2.0**-10)).all()
    exact = torch.tensor([[448.0, 1.0, -1.25, 0.001953125]])  # representable once scaled by 1
    assert torch.equal(fmt.decode(fmt.encode(exact)), exact)
    zero = torch.zeros(1, 4)
    assert torch.equal(fmt.decode(fmt.encode(zero)), zero)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_round_to_nearest_half_formats(name):
    fmt = get_format(name)
    x = torch.randn(10000) * 10
    rel = ((fmt.decode(fmt.encode(x)) - x).abs() / x.abs()).max()
    assert rel <= (2.0**-8 if name == "bf16" else 2.0**-11)
    if name == "fp16":
        assert fmt.decode(fmt.encode(torch.tensor([1e5]))).item() == 65504.0  # saturates instead of inf


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_is_unbiased_and_reproducible(dtype):
    # values between representable neighbours, including fp16 subnormals
    x = torch.tensor([1.0 + 2.0**-12, -3.3, 1e-3, 6.0e-6, 12345.678]).repeat(40000, 1)
    first = stochastic_round(x, dtype, torch.Generator().manual_seed(1))
    again = stochastic_round(x, dtype, torch.Generator().manual_seed(1))
    other = stochastic_round(x, dtype, torch.Generator().manual_seed(2))
    assert torch.equal(first, again) and not torch.equal(first, other)
    lo, hi = first.float().amin(0), first.float().amax(0)
    assert (lo <= x[0]).all() and (hi >= x[0]).all() and (hi - lo > 0).all()  # both neighbours occur
    # mean within 4 standard errors of the exact value (variance <= (hi-lo)^2 / 4)
    stderr = (hi - lo) / 2 / x.shape[0] ** 0.5
    assert ((first.float().mean(0) - x[0]).abs() <= 4 * stderr).all()
    assert ((first.float() - x).abs() <= (hi - lo)).all()  # less than one ulp away


def test_unknown_format_and_sr_combinations():
    with pytest.raises(ValueError, match="unknown storage format 'int4'"):
        get_format("int4")
    with pytest.raises(ValueError, match="stochastic rounding is available for bf16 and fp16"):
        get_format("nvfp4", stochastic_rounding=True)
