"""Storage formats for a recurrent state (pure torch, exact bit layouts, packed storage, any device).

A state tensor is stored as a dict of tensors (its *encoding*) and read back as float32. "Rows" are the state's
inner (last, contiguous) dimension: d_state for Mamba-2 ``[B, H, P, N]``, the value dim for GDN/KDA ``[B, H, K, V]``.

| format | encoding | bytes / element | worst-case error of one write |
|---|---|---|---|
| ``fp32`` | the float32 tensor | 4 | 0 |
| ``bf16`` | bfloat16, round to nearest even | 2 | rel. 2^-8 |
| ``bf16`` + SR | bfloat16, stochastic rounding | 2 | rel. 2^-7 (< 1 ulp), unbiased |
| ``fp16`` | float16, round to nearest even | 2 | rel. 2^-11 (normals), abs. 2^-25 (subnormals) |
| ``fp16`` + SR | float16, stochastic rounding | 2 | rel. 2^-10 / abs. 2^-24, unbiased |
| ``fp8`` | E4M3 codes (uint8), one fp32 scale (row amax / 448) per row | 1 + 4/row | rel. 2^-4, abs. 2^-10 amax/448 |
| ``nvfp4`` | E2M1 x2 per byte, E4M3 scale per 16, fp32 scale per sequence | 0.5 + 1/16 | (1+2^-4)/6 x block amax |

NVFP4 details: element 2i sits in the low nibble of byte i, 2i+1 in the high nibble; the sequence (batch-row) scale
is amax / (6 x 448); block scales that underflow E4M3 leave an error floor of 2^-9 x that scale.

Values beyond a format's range saturate (SSM states must not turn into inf/NaN). Stochastic rounding picks the upper
or lower neighbour with the probability that makes the expected value exact, from a seeded ``torch.Generator``:
the same seed and the same sequence of writes give the same bits.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite E4M3 (fn) value
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7; bit 3 is the sign
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
NVFP4_BLOCK = 16

Encoding = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------------------- rounding
def stochastic_round(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round float32 ``x`` to ``dtype`` (bf16/fp16) up or down at random, unbiased: E[result] = x (saturating)."""
    x = x.float()
    finfo = torch.finfo(dtype)
    x = x.clamp(-finfo.max, finfo.max)
    nearest = x.to(dtype)
    near = nearest.float()
    direction = torch.where(near > x, torch.full_like(x, float("-inf")), torch.full_like(x, float("inf"))).to(dtype)
    other = torch.nextafter(nearest, direction)
    other = torch.where(torch.isfinite(other), other, nearest)
    gap = other.float() - near
    p_other = torch.where(gap != 0, (x - near) / gap, torch.zeros_like(x))
    u = torch.rand(x.shape, generator=generator, device=x.device)
    return torch.where(u < p_other, other, nearest)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """float -> E2M1 codes (uint8 0..15): round to nearest, ties to the even code, saturate at +-6."""
    magnitude = x.abs().float()
    boundaries = torch.tensor(_E2M1_MIDPOINTS, device=x.device)
    code = torch.bucketize(magnitude, boundaries, right=False)  # boundaries[i-1] < m <= boundaries[i] -> i
    tie = magnitude == boundaries[code.clamp(max=len(_E2M1_MIDPOINTS) - 1)]
    code = torch.where(tie & (code % 2 == 1), code + 1, code)
    sign = (x < 0) & (code != 0)
    return (code + 8 * sign.to(code.dtype)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), device=codes.device)
    return table[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] uint8 codes (< 16) -> [..., n] bytes; element 2i in the low nibble, 2i+1 in the high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """float -> E4M3 (fn) bit patterns as uint8, round to nearest even, saturating at +-448."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(bits: torch.Tensor) -> torch.Tensor:
    return bits.view(torch.float8_e4m3fn).float()


# ---------------------------------------------------------------------------------------------------------- formats
class StorageFormat:
    name = "abstract"
    bits_per_element = 32.0

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Encoding:
        raise NotImplementedError

    def decode(self, encoding: Encoding) -> torch.Tensor:
        raise NotImplementedError

    def bytes_per_element(self, row: int) -> float:
        return self.bits_per_element / 8

    def __repr__(self) -> str:
        return self.name


class Float32Format(StorageFormat):
    name = "fp32"

    def encode(self, x, generator=None):
        return {"values": x.float()}

    def decode(self, encoding):
        return encoding["values"]


class HalfFormat(StorageFormat):
    """bfloat16 or float16, round to nearest even or stochastic rounding."""

    bits_per_element = 16.0

    def __init__(self, dtype: torch.dtype, stochastic: bool = False):
        self.dtype, self.stochastic = dtype, stochastic
        self.name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype] + ("-sr" if stochastic else "")

    def encode(self, x, generator=None):
        if self.stochastic:
            return {"values": stochastic_round(x, self.dtype, generator)}
        finfo = torch.finfo(self.dtype)
        return {"values": x.float().clamp(-finfo.max, finfo.max).to(self.dtype)}

    def decode(self, encoding):
        return encoding["values"].float()


class Fp8RowFormat(StorageFormat):
    """E4M3 codes with one float32 scale per row (amax / 448)."""

    name = "fp8"
    bits_per_element = 8.0

    def encode(self, x, generator=None):
        x = x.float()
        amax = x.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return {"codes": e4m3_encode(x / scale), "scale": scale}

    def decode(self, encoding):
        return e4m3_decode(encoding["codes"]) * encoding["scale"]

    def bytes_per_element(self, row: int) -> float:
        return 1.0 + 4.0 / row


class NvFp4Format(StorageFormat):
    """NVFP4: E2M1 values packed two per byte, an E4M3 scale per 16 elements along the row, a float32 scale per
    sequence (batch row). Rows whose length is not a multiple of 16 are padded with zeros in storage."""

    name = "nvfp4"
    bits_per_element = 4.0

    def encode(self, x, generator=None):
        if x.dim() < 2:
            raise ValueError("nvfp4 encodes states of shape [batch, ..., row]")
        x = x.float()
        row = x.shape[-1]
        pad = (-row) % NVFP4_BLOCK
        if pad:
            x = torch.nn.functional.pad(x, (0, pad))
        blocks = x.unflatten(-1, (-1, NVFP4_BLOCK))  # [..., nblocks, 16]
        amax = x.abs().flatten(1).amax(dim=1)  # one scale per sequence (dim 0)
        tensor_scale = torch.where(amax > 0, amax / (6.0 * FP8_MAX), torch.ones_like(amax))  # [B]
        g = tensor_scale.view(-1, *([1] * (blocks.dim() - 1)))
        block_scale_bits = e4m3_encode(blocks.abs().amax(dim=-1, keepdim=True) / 6.0 / g)
        block_scale = e4m3_decode(block_scale_bits) * g
        scaled = torch.where(block_scale > 0, blocks / torch.where(block_scale > 0, block_scale, 1.0), 0.0)
        codes = e2m1_encode(scaled).flatten(-2)
        return {
            "packed": pack_nibbles(codes),
            "block_scale": block_scale_bits.squeeze(-1),
            "tensor_scale": tensor_scale,
            "row": torch.tensor(row, device=x.device),  # logical row length (0-d: not indexed by batch)
        }

    def decode(self, encoding):
        values = e2m1_decode(unpack_nibbles(encoding["packed"])).unflatten(-1, (-1, NVFP4_BLOCK))
        g = encoding["tensor_scale"].view(-1, *([1] * (values.dim() - 1)))
        out = (values * e4m3_decode(encoding["block_scale"]).unsqueeze(-1) * g).flatten(-2)
        return out[..., : int(encoding["row"])]

    def bytes_per_element(self, row: int) -> float:
        return 0.5 + 1.0 / NVFP4_BLOCK


def get_format(name: str, stochastic_rounding: bool = False) -> StorageFormat:
    if name == "fp32":
        fmt: StorageFormat = Float32Format()
    elif name in ("bf16", "fp16"):
        return HalfFormat(torch.bfloat16 if name == "bf16" else torch.float16, stochastic_rounding)
    elif name == "fp8":
        fmt = Fp8RowFormat()
    elif name == "nvfp4":
        fmt = NvFp4Format()
    else:
        raise ValueError(f"unknown storage format {name!r}; use one of {FORMATS}")
    if stochastic_rounding:
        raise ValueError(f"stochastic rounding is available for bf16 and fp16 storage, not {name}")
    return fmt


FORMATS = ("fp32", "bf16", "fp16", "fp8", "nvfp4")
