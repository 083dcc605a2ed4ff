"""Ring buffers: pointer-move rollback, wrap-around, growth."""

import pytest
import torch

from hf_replayssm.buffers import ConvRing, RecordRing


def _records(start, count, batch=2):
    values = torch.arange(start, start + count, dtype=torch.float32)
    return {"x": values[None, :, None].expand(batch, count, 3).clone(), "dt": values[None, :].expand(batch, count)}


def _seq(ring):
    return ring.read()["dt"][0].tolist()


def test_ring_commit_drop_and_wrap():
    ring = RecordRing(5)
    ring.allocate(_records(0, 1))
    ring.append(_records(0, 3), pending=False)
    ring.append(_records(3, 2), pending=True)
    assert (ring.num_committed, ring.num_pending) == (3, 2)
    ring.drop_newest(1)  # reject the last draft
    ring.commit()
    assert _seq(ring) == [0, 1, 2, 3]
    ring.drop_oldest(3)  # folded into the checkpoint
    ring.append(_records(4, 4), pending=True)  # wraps around the end of the storage
    assert _seq(ring) == [3, 4, 5, 6, 7]
    assert (ring.num_committed, ring.num_pending) == (1, 4)
    with pytest.raises(RuntimeError, match="overflow"):
        ring.append(_records(8, 1), pending=True)
    with pytest.raises(RuntimeError, match="cannot drop"):
        ring.drop_newest(6)


def test_ring_grow_keeps_order():
    ring = RecordRing(4)
    ring.allocate(_records(0, 1))
    ring.append(_records(0, 3), pending=False)
    ring.drop_oldest(2)
    ring.append(_records(3, 3), pending=True)  # wrapped
    ring.grow(8)
    assert _seq(ring) == [2, 3, 4, 5]
    assert (ring.num_committed, ring.num_pending) == (1, 3)
    ring.append(_records(6, 4), pending=True)
    assert _seq(ring) == [2, 3, 4, 5, 6, 7, 8, 9]


def test_conv_ring_window_and_rewind():
    conv = ConvRing(6)
    inputs = torch.arange(1, 11, dtype=torch.float32)[None, None, :]  # token t has input t+1
    conv.allocate(inputs[..., :1])
    assert conv.window(3).tolist() == [[[0, 0, 0]]]  # zeros before the sequence start
    conv.write(inputs[..., :2])
    assert conv.window(3).tolist() == [[[0, 1, 2]]]
    conv.write(inputs[..., 2:8])
    assert conv.window(3).tolist() == [[[6, 7, 8]]]
    conv.rewind(3, kernel=3)
    assert conv.window(3).tolist() == [[[3, 4, 5]]]
    with pytest.raises(RuntimeError, match="cannot rewind"):
        conv.rewind(2, kernel=3)  # would need the input of token 0, already overwritten
    conv.grow(10)
    assert conv.window(3).tolist() == [[[3, 4, 5]]]


def test_conv_ring_random_writes_rewinds_and_growth_match_the_full_history():
    """Random writes (1 token to several capacities), rewinds up to what the ring allows, and growth: the window is
    always the last `kernel` inputs of the full history (zeros before the start), and a single-token step's window
    is a view (no copy)."""
    gen = torch.Generator().manual_seed(3)
    for capacity, kernel in ((4, 4), (6, 3), (9, 4)):
        conv = ConvRing(capacity)
        history: list[torch.Tensor] = []
        conv.allocate(torch.zeros(2, 3, 1))
        for _ in range(200):
            action = int(torch.randint(0, 10, (1,), generator=gen))
            if action < 6:
                count = 1 if action < 4 else int(torch.randint(1, 3 * conv.capacity, (1,), generator=gen))
                inputs = torch.randn(2, 3, count, generator=gen)
                conv.write(inputs)
                history.extend(inputs.unbind(-1))
            elif action < 9:
                depth = int(torch.randint(0, conv.rewindable(kernel) + 1, (1,), generator=gen))
                conv.rewind(depth, kernel)
                del history[len(history) - depth :]
            else:
                conv.grow(conv.capacity + int(torch.randint(0, 3, (1,), generator=gen)))
            padded = [torch.zeros(2, 3)] * kernel + history
            expected = torch.stack(padded[len(padded) - kernel :], dim=-1)
            window = conv.window(kernel)
            assert torch.equal(window, expected), (capacity, kernel, conv.position)
            assert window.untyped_storage().data_ptr() == conv.buffer.untyped_storage().data_ptr()


def test_ring_extend_counts_records_a_kernel_wrote_in_append_order():
    """``extend`` (a verify kernel wrote the records into the slots ``append`` would use): same sequence and counts as
    ``append``, wrap-around included, and the same overflow error."""
    ring, reference = RecordRing(5), RecordRing(5)
    for r in (ring, reference):
        r.allocate(_records(0, 1))
        r.append(_records(0, 3), pending=False)
        r.drop_oldest(2)  # origin 2: the next three slots wrap around the end of the storage
    slots = (ring.origin + ring.size + torch.arange(3)) % ring.capacity
    for name, buf in ring.fields.items():  # what the kernel does
        buf.index_copy_(1, slots, _records(3, 3)[name].to(buf.dtype))
    ring.extend(3, pending=True)
    reference.append(_records(3, 3), pending=True)
    assert _seq(ring) == _seq(reference) == [2, 3, 4, 5]
    assert (ring.num_committed, ring.num_pending) == (reference.num_committed, reference.num_pending) == (1, 3)
    ring.extend(1, pending=False)
    assert (ring.num_committed, ring.num_pending) == (2, 3)
    with pytest.raises(RuntimeError, match="overflow"):
        ring.extend(1, pending=True)


def test_per_row_rollback_shares_indices_only_between_equal_geometries():
    """One rollback's memo: rings and conv windows of the same geometry reuse one mask / index tensor and end as they
    would alone; a ring whose newest slot differs (other origin) or a conv window with another kernel builds its own.
    The per-row counts go to the device once for all of them."""
    counts = [2, 0, 3]

    def ring_at(origin):
        ring = RecordRing(6)
        ring.allocate(_records(0, 1, batch=3))
        ring.append(_records(0, origin + 1, batch=3), pending=False)
        ring.drop_oldest(origin)  # one committed record left, the oldest at slot `origin`
        ring.append(_records(10, 4, batch=3), pending=True)
        return ring

    def conv_with(seed):
        conv = ConvRing(8)
        inputs = torch.randn(3, 2, 9, generator=torch.Generator().manual_seed(seed))
        conv.allocate(inputs[..., :1])
        conv.write(inputs)
        return conv

    memo = {}
    alone, shared, other = ring_at(1), ring_at(1), ring_at(2)
    alone.overwrite_newest(counts, {"dt": -1.0})
    shared.overwrite_newest(counts, {"dt": -1.0}, memo)

    def built():
        return sorted(key[0] for key in memo)

    assert built() == ["counts", "ring"]
    again = ring_at(1)
    again.overwrite_newest(counts, {"dt": -1.0}, memo)
    other.overwrite_newest(counts, {"dt": -1.0}, memo)
    assert built() == ["counts", "ring", "ring"]  # the same geometry reused its mask; another origin built its own
    for ring in (shared, again):
        assert torch.equal(ring.fields["dt"], alone.fields["dt"]) and torch.equal(ring.fields["x"], alone.fields["x"])
    assert other.read()["dt"][:, -4:].tolist() == [[10, 11, -1, -1], [10, 11, 12, 13], [10, -1, -1, -1]]

    conv_alone, conv_shared, conv_wide = conv_with(0), conv_with(1), conv_with(2)
    reference_shared, reference_wide = conv_with(1), conv_with(2)
    conv_alone.compact_rows(counts, kernel=3, memo=memo)
    conv_shared.compact_rows(counts, kernel=3, memo=memo)
    conv_wide.compact_rows(counts, kernel=4, memo=memo)
    reference_shared.compact_rows(counts, kernel=3)
    reference_wide.compact_rows(counts, kernel=4)
    assert built() == ["conv", "conv", "counts", "ring", "ring"]
    assert torch.equal(conv_shared.buffer, reference_shared.buffer)
    assert torch.equal(conv_wide.buffer, reference_wide.buffer)
    assert not torch.equal(conv_alone.buffer, reference_shared.buffer)  # other inputs: the memo shares indices only
