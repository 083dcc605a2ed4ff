"""Storage formats for a recurrent state (pure torch, exact bit layouts, packed storage, any device).

A state tensor is stored as a dict of tensors (its *encoding*) and read back as float32. "Rows" are the state's
inner (last, contiguous) dimension: d_state for Mamba-2 ``[B, H, P, N]``, the value dim for GDN/KDA ``[B, H, K, V]``.

| format | encoding | bytes / element | worst-case error of one write |
|---|---|---|---|
| ``fp32`` | the float32 tensor | 4 | 0 |
| ``bf16`` | bfloat16, round to nearest even | 2 | rel. 2^-8 |
| ``bf16`` + SR | bfloat16, stochastic rounding (Philox-4x32-10 noise, below) | 2 | rel. 2^-7 (< 1 ulp), unbiased |
| ``fp16`` | float16, round to nearest even | 2 | rel. 2^-11 (normals), abs. 2^-25 (subnormals) |
| ``fp16`` + SR | float16, stochastic rounding (Philox-4x32-10 noise, below) | 2 | rel. 2^-10 / abs. 2^-24, unbiased |
| ``fp8`` | E4M3 codes (uint8), one fp32 scale (row amax / 448) per row | 1 + 4/row | rel. 2^-4, abs. 2^-10 amax/448 |
| ``nvfp4`` | E2M1 x2 per byte, E4M3 scale per 16, fp32 scale per sequence | 0.5 + 1/16 | (1+2^-4)/6 x block amax |

NVFP4 details: element 2i sits in the low nibble of byte i, 2i+1 in the high nibble; the sequence (batch-row) scale
is amax / (6 x 448); the logical row length is kept as a 0-d int64 tensor ``row``; block scales that underflow E4M3
leave an error floor of 2^-9 x that scale.

Values beyond a format's range saturate (SSM states must not turn into inf/NaN).

Stochastic rounding (SR) is counter-based: the noise of an element is a pure function of (seed, layer, position, e),
never of the batch it is computed in, of other elements, or of the order of writes. For a state ``[B, *row_shape]``
written as the checkpoint at token ``position`` of layer ``layer`` under a policy with ``seed``, the element at flat
index ``e`` (row-major over ``row_shape``, the same ``e`` in every batch row) uses, with all arithmetic on uint32
(multiplication, addition mod 2^32; ``mulhi``/``mullo`` the high/low 32 bits of the 64-bit product):

    key     (k0, k1)         = (seed mod 2^32, layer mod 2^32)
    counter (c0, c1, c2, c3) = (e mod 2^32, position mod 2^32, 0, 0)
    10 rounds of:  c0, c1, c2, c3 = mulhi(0xCD9E8D57, c2) ^ c1 ^ k0, mullo(0xCD9E8D57, c2),
                                    mulhi(0xD2511F53, c0) ^ c3 ^ k1, mullo(0xD2511F53, c0)
                   k0, k1 = k0 + 0x9E3779B9, k1 + 0xBB67AE85
    bits = c0                                 (the first output word of Philox-4x32-10)
    u    = (bits >> 8) * 2^-24                (float32, exact: a multiple of 2^-24 in [0, 1 - 2^-24])

This is Philox-4x32-10 (Salmon et al., SC'11; Random123's known-answer vectors hold, see the tests); in Triton it is
``tl.philox((layer << 32) | seed, e, position, 0, 0)[0]`` (uint32 counters, default ``n_rounds=10``). The
rounding then picks, from the nearest ``dtype`` value ``near`` (round to nearest even of the clamped ``x``) and its
neighbour ``other`` on the far side of ``x``, ``other`` iff ``u < p`` with ``p = (x - near) / (other - near)`` in
float32. ``other - near`` is a power of two and ``x - near`` is exact, so ``p`` is exact in [0, 1/2]; hence
P(other) = ceil(p 2^24) / 2^24, which equals ``p`` whenever ``p`` is a multiple of 2^-24 (all fp16 normals and bf16
values) and exceeds it by < 2^-24 otherwise. At the saturation bound (``other`` infinite) ``p = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # largest finite E4M3 (fn) value
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7; bit 3 is the sign
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
NVFP4_BLOCK = 16

Encoding = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------------------- rounding
PHILOX_ROUNDS = 10
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key increments (Weyl sequence)
_MASK32 = 0xFFFFFFFF


def _mulhilo32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of the 64-bit product of the uint32 constant ``a`` and uint32 values ``b`` (int64
    tensor), from the 16-bit halves of ``b`` so that no int64 intermediate overflows (all stay below 2^49):
    a b = (a b_hi) 2^16 + a b_lo = (a b_hi >> 16) 2^32 + t with t = a b_lo + ((a b_hi) & 0xFFFF) 2^16."""
    upper = (b >> 16) * a
    t = (b & 0xFFFF) * a + ((upper & 0xFFFF) << 16)
    return (upper >> 16) + (t >> 32), t & _MASK32


def philox4x32(counter, key: tuple[int, int], rounds: int = PHILOX_ROUNDS) -> tuple[torch.Tensor, ...]:
    """Philox-4x32-``rounds`` on uint32 values held in int64 tensors (broadcast together): ``counter`` four int64
    tensors (or ints), ``key`` two ints; returns the four output words as int64 tensors in [0, 2^32).

    One round: ``(c0, c1, c2, c3) <- (mulhi(M1, c2) ^ c1 ^ k0, mullo(M1, c2), mulhi(M0, c0) ^ c3 ^ k1,
    mullo(M0, c0))`` with ``M0 = 0xD2511F53, M1 = 0xCD9E8D57``, then ``k0 += 0x9E3779B9, k1 += 0xBB67AE85`` (mod
    2^32). Bit-identical to Random123's ``philox4x32_R`` and Triton's ``tl.philox``."""
    device = next((v.device for v in counter if isinstance(v, torch.Tensor)), None)
    c = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.int64, device=device) for v in counter))
    c0, c1, c2, c3 = (v & _MASK32 for v in c)
    k0, k1 = key[0] & _MASK32, key[1] & _MASK32
    for _ in range(rounds):
        hi0, lo0 = _mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """uint32 values (int64 tensor) -> float32 in [0, 1): the top 24 bits times 2^-24 (exact)."""
    return (bits >> 8).to(torch.float32) * 2.0**-24


def sr_uniforms(seed: int, layer: int, position, shape, device=None) -> torch.Tensor:
    """The stochastic-rounding uniforms of one batch row: a float32 tensor of ``shape`` (the state's non-batch
    dims) whose element at row-major flat index ``e`` is ``bits_to_uniform(philox4x32((e, position, 0, 0),
    (seed, layer))[0])``. ``position`` may also be an int64 tensor broadcastable to ``shape`` (used by tests)."""
    shape = torch.Size(shape)
    e = torch.arange(shape.numel(), dtype=torch.int64, device=device).view(shape)
    position = torch.as_tensor(position, dtype=torch.int64, device=device)
    bits, _, _, _ = philox4x32((e, position, 0, 0), (seed, layer))
    return bits_to_uniform(bits)


@dataclass(frozen=True)
class NoiseKey:
    """Where a stochastically rounded write happens: the policy ``seed``, the SSM ``layer`` and the token
    ``position`` of the checkpoint. Its noise is :func:`sr_uniforms` of the state's non-batch shape, the same for
    every batch row, so a sequence rounds the same way whatever batch it runs in."""

    seed: int = 0
    layer: int = 0
    position: int = 0

    def uniforms(self, x: torch.Tensor) -> torch.Tensor:
        """Uniforms for a state ``x`` of shape ``[batch, ...]``, shaped ``x.shape[1:]`` (broadcast over batch)."""
        return sr_uniforms(self.seed, self.layer, self.position, x.shape[1:], x.device)


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, uniforms: torch.Tensor) -> torch.Tensor:
    """Round float32 ``x`` to ``dtype`` (bf16/fp16) up or down at random, unbiased: E[result] = x (saturating).

    ``uniforms``: float32 in [0, 1), broadcastable to ``x`` (e.g. :meth:`NoiseKey.uniforms`); the neighbour of
    ``x`` other than the nearest is taken iff ``u < (x - near) / (other - near)`` (see the module docstring)."""
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
    return torch.where(uniforms.to(device=x.device, dtype=torch.float32) < p_other, other, nearest)


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

    def encode(self, x: torch.Tensor, noise: NoiseKey | None = None) -> Encoding:
        """Encode ``x`` (``[batch, ...]``). ``noise`` keys stochastic rounding; formats without it ignore it."""
        raise NotImplementedError

    def decode(self, encoding: Encoding) -> torch.Tensor:
        raise NotImplementedError

    def bytes_per_element(self, row: int) -> float:
        return self.bits_per_element / 8

    def __repr__(self) -> str:
        return self.name


class Float32Format(StorageFormat):
    name = "fp32"

    def encode(self, x, noise=None):
        return {"values": x.float()}

    def decode(self, encoding):
        return encoding["values"]  # the stored tensor itself, not a copy


class HalfFormat(StorageFormat):
    """bfloat16 or float16, round to nearest even or stochastic rounding (noise from the write's :class:`NoiseKey`:
    Philox-4x32-10 of (seed, layer, position, element), see the module docstring)."""

    bits_per_element = 16.0

    def __init__(self, dtype: torch.dtype, stochastic: bool = False):
        self.dtype, self.stochastic = dtype, stochastic
        self.name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype] + ("-sr" if stochastic else "")

    def encode(self, x, noise=None):
        if self.stochastic:  # no key: that of (seed 0, layer 0, position 0)
            return {"values": stochastic_round(x, self.dtype, (noise or NoiseKey()).uniforms(x))}
        finfo = torch.finfo(self.dtype)
        return {"values": x.float().clamp(-finfo.max, finfo.max).to(self.dtype)}

    def decode(self, encoding):
        return encoding["values"].float()


class Fp8RowFormat(StorageFormat):
    """E4M3 codes with one float32 scale per row (amax / 448)."""

    name = "fp8"
    bits_per_element = 8.0

    def encode(self, x, noise=None):
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

    def encode(self, x, noise=None):
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
