"""Short-conv adapter (lfm2, lfm2_moe): layers whose only state is the window of a gated short causal convolution.

An LFM2 ``ShortConv`` mixer computes ``C * conv(B * x)`` with a depthwise causal conv of ``conv_L_cache`` taps; it
has no recurrent state. Nothing is replayed or folded: the layer's schedule keeps only the conv ring, which rewinds
exactly, and counts the tokens fed while recording so that ``crop`` can drop them (``ConvSchedule``).

Inside a replay call the cache hands the mixer no conv state, so the mixer always takes its multi-token branch:
``cache.update_conv_state`` (our conv ring returns ``[window, new inputs]``), then its own ``causal_conv1d_fn``. The
interceptor on ``causal_conv1d_fn`` only checks that the input came from the ring and counts the tokens.
"""

from __future__ import annotations

import torch

from ..schedule import ReplaySchedule
from .base import CallArgs, FamilyAdapter, interceptor


class ConvSchedule(ReplaySchedule):
    """The schedule of a conv-only layer: no checkpoint and no records, only the conv ring. The record ring is
    never allocated; its ``num_pending`` counts the tokens fed while recording since the last ``crop`` (what a crop
    may drop), which is what the inherited conv-window growth and rollback depth read."""

    @property
    def allocated(self) -> bool:  # batch operations (beam search, row selection) must reach the conv ring
        return self.conv.buffer is not None

    def _ensure_conv(self, like: torch.Tensor, kernel: int) -> None:
        if self.conv.buffer is None:
            self.device, self.batch_size = like.device, like.shape[0]
        super()._ensure_conv(like, kernel)

    def conv_update(self, inputs: torch.Tensor, kernel: int) -> torch.Tensor:
        count = inputs.shape[-1]
        droppable = count - self._head(count) if self.recording else 0  # a first forward's prompt stays
        full = super().conv_update(inputs, kernel)  # while recording: grows the ring to keep pending + new inputs
        self.ring.num_pending += droppable
        return full

    def forward_tokens(self, tokens, chunk_fn=None, out_dtype=None) -> torch.Tensor:
        raise RuntimeError("a short-conv layer has no recurrence to replay; its mixer only uses the conv window")

    def crop(self, count: int) -> None:
        super().crop(count)
        self.ring.clear()  # kept tokens leave nothing to fold: their inputs live on in the conv window

    def deactivate_recording(self) -> None:
        super().deactivate_recording()
        self.ring.clear()

    def drop_rows_newest(self, dropped: list[int], memo: dict | None = None, packed: bool = False,
                         checked: tuple[int, int] | None = None) -> None:
        # (never packed: PackedRollback takes plain schedules only)
        super().drop_rows_newest(dropped, memo, packed, checked)
        self.ring.clear()


class ShortConvRecurrence:
    """No recurrent state: tells ``ReplayLayer`` to run a ``ConvSchedule``."""

    name = "short_conv"
    per_token: tuple[str, ...] = ()
    schedule_class = ConvSchedule


@interceptor
def _conv(module, call, a: CallArgs, original):
    """``causal_conv1d_fn`` inside a replay call: its input [B, C, K + T] is the conv ring's window followed by the
    T new inputs (what ``update_conv_state`` returned); the model's own conv computes the outputs."""
    schedule = call.layer.schedule
    fed = schedule.conv.position - schedule.tokens_seen  # inputs the conv ring took in this forward
    if schedule.conv.buffer is not None and a["hidden_states"].shape[-1] == schedule.conv_kernel + fed:
        call.handled_tokens += fed  # otherwise the mixer bypassed the ring: the forward wrapper raises
    return a.call(original)


ADAPTER = FamilyAdapter(
    name="short_conv",
    recurrence=ShortConvRecurrence,
    mixers={
        "Lfm2ShortConv": ("lfm2", "lfm2_vl"),  # LFM2-VL: LFM2 under a vision tower
        "Lfm2MoeShortConv": ("lfm2_moe",),
        "Lfm3ShortConv": ("lfm3", "lfm3_vl"),
    },
    interceptors={"causal_conv1d_fn": _conv},
)
