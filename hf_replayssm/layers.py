"""Cache layers: ``ReplayLayer`` holds one SSM layer's checkpoint, record ring and conv window.

The schedule, per layer (L = ``buffer_len``):
* prefill (any plain multi-token forward): the model's own chunked path runs from the checkpoint and writes the
  final state; the ring is empty. Flush boundaries sit every L tokens from there;
* a decode step reads checkpoint + ring and appends one record (no state write); the step that reaches the next
  boundary flushes: the ring and the token are folded into the checkpoint;
* while recording (speculative decoding) new tokens are *pending* records. Each token still reads the checkpoint
  of its own boundary; when a window crosses a boundary that checkpoint is staged from the window's records and
  stored only if the crop keeps them. ``crop(-r)`` drops the newest r records and rewinds the conv window (pointer
  moves) and commits the rest. A rollback deeper than what is still buffered raises.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Mapping

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from .buffers import ConvRing, RecordRing
from .precision import CheckpointStore, PrecisionPolicy

ChunkFn = Callable[[int, int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _length(records: Mapping[str, torch.Tensor]) -> int:
    return next(iter(records.values())).shape[1] if records else 0


def _cat(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not a:
        return dict(b)
    return {name: torch.cat([a[name].to(torch.float32), b[name].to(torch.float32)], dim=1) for name in b}


class RollbackError(ValueError):
    """A ``crop`` asked for more than the cache can undo exactly."""


class ReplayLayer(LinearAttentionLayer):
    """ReplaySSM state of one SSM layer (also exposes the ``LinearAttentionLayer`` attributes transformers reads)."""

    def __init__(self, buffer_len: int, window: int, policy: PrecisionPolicy | list[PrecisionPolicy],
                 layer_idx: int = 0, number_of_states: int = 1, **kwargs):
        super().__init__(number_of_states=number_of_states)
        self.buffer_len = buffer_len
        self.window = window
        self.ring = RecordRing(buffer_len + window)
        self.conv = ConvRing(0)
        self.conv_kernel = None
        self.store = CheckpointStore(policy, seed_offset=layer_idx)
        self.recurrence = None  # a ``recurrences`` family, set by the adapter on first use
        self.recording = False
        # Stock mixers skip their in-place single-token conv update while a layer records its past; keeping this
        # True routes every conv step through ``update_conv_state``, i.e. through the conv ring.
        self.record_past = True
        self.tokens_seen = 0
        self.prompt_tokens = 0  # announced prompt length (generate() with speculation); 0 = the first forward
        self._prompt_len = 0
        self.mixer_ref: weakref.ref | None = None
        self.counters: Counter = Counter()
        self.checkpoint_position = 0  # tokens folded into the stored checkpoint
        self.anchor = 0  # position of the last prefill; flush boundaries sit at anchor + k * buffer_len
        self._staged: dict = {}  # boundary position -> StagedCheckpoint inside pending speculative records
        self._params: dict[str, torch.Tensor] = {}  # per-layer constants of the last call (e.g. Mamba-2's A)

    # ------------------------------------------------------------------ public view
    @property
    def checkpoint(self) -> torch.Tensor | None:
        """The state the recurrence continues from (float32 view)."""
        return self.store.recurrence() if self.store.allocated else None

    @property
    def num_buffered(self) -> int:
        """Committed records not yet folded into the checkpoint."""
        return self.ring.num_committed

    @property
    def num_pending(self) -> int:
        """Speculative records a ``crop`` may still drop."""
        return self.ring.num_pending

    def current_state(self) -> torch.Tensor:
        """The full recurrent state after every buffered record (materialised on demand; for checks and tools)."""
        return self.recurrence.fold(self.store.recurrence(), self.ring.read(), self._params, exact=True)

    # ------------------------------------------------------------------ transformers layer API
    def lazy_initialization(self, *args, **kwargs) -> None:  # allocation happens on first use
        pass

    def activate_past_recording(self) -> None:
        self.recording = True

    def deactivate_past_recording(self) -> None:
        self.recording = False
        self.ring.commit()
        self._resolve_staged()

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return True

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size=None, **kwargs):
        """Return ``[history, new]`` for the model's own causal conv and remember the new inputs."""
        kernel = conv_kernel_size or self.conv_kernel
        if kernel is None:
            raise ValueError("update_conv_state needs conv_kernel_size on its first call")
        self._ensure_conv(conv_states, kernel)
        full = torch.cat([self.conv.window(kernel).to(conv_states.dtype), conv_states], dim=-1)
        self.conv.write(conv_states)
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs):
        # The replay path already updated the layer; the stock mixer only hands back what we returned.
        return recurrent_states

    def get_seq_length(self) -> int:
        return self.tokens_seen

    # ------------------------------------------------------------------ allocation
    def _ensure_conv(self, like: torch.Tensor, kernel: int) -> None:
        if self.conv.buffer is None:
            self.conv_kernel = kernel
            self.conv = ConvRing(kernel + self.ring.capacity)
            self.conv.allocate(like)
            self.conv_states[0] = self.conv.buffer  # compat: stock code only ever hands it back to us
            self.is_conv_states_initialized[0] = True

    def _ensure_state(self, tokens: Mapping[str, torch.Tensor]) -> None:
        if not self.store.allocated:
            device = next(v for v in tokens.values() if isinstance(v, torch.Tensor)).device
            self.store.allocate(self.recurrence.state_shape(tokens), device)
            self.ring.allocate(self.recurrence.record_examples(tokens))
            self.recurrent_states[0] = self.store.recurrence()
            self.is_recurrent_states_initialized[0] = True
            self.device = device

    def prompt_part(self, count: int) -> int:
        """How many leading tokens of a forward of ``count`` tokens are prompt (prefill) rather than generated.
        The prompt is the first ``prompt_tokens`` tokens when generate() announced them, else the first forward;
        a prompt token fed again after a rollback is still a prompt token."""
        if self.tokens_seen == 0 and not self.prompt_tokens:
            self._prompt_len = count
        prompt_len = self.prompt_tokens or self._prompt_len
        return max(0, min(prompt_len - self.tokens_seen, count))

    def reserve_window(self, window: int) -> None:
        """Make sure speculative windows of ``window`` tokens can be rolled back exactly."""
        if window > self.window:
            self.window = window
            self.ring.grow(self.buffer_len + window)
            if self.conv_kernel is not None:
                self.conv.grow(self.conv_kernel + self.ring.capacity)

    # ------------------------------------------------------------------ the replay step
    def forward_tokens(self, tokens: Mapping[str, torch.Tensor], chunk_fn: ChunkFn | None = None) -> torch.Tensor:
        """Outputs [B, T, ...] (float32) of T new tokens; updates ring / checkpoint per the schedule."""
        self._ensure_state(tokens)
        self._params = {k: v for k, v in tokens.items() if k not in self.recurrence.per_token}
        if self.recording:
            return self._forward_recording(tokens, chunk_fn)
        self.ring.commit()
        return self._forward_plain(tokens, chunk_fn)

    def _num_tokens(self, tokens: Mapping[str, torch.Tensor]) -> int:
        return tokens[self.recurrence.per_token[0]].shape[1]

    def _boundary(self, position: int) -> int:
        """The flush boundary a token at ``position`` reads from: the anchor (last prefill) plus a multiple of L."""
        return self.anchor + (position - self.anchor) // self.buffer_len * self.buffer_len

    def _forward_plain(self, tokens, chunk_fn):
        ring, rec = self.ring, self.recurrence
        count = self._num_tokens(tokens)
        while ring.size >= self.buffer_len:  # complete periods left by speculative decoding
            self._commit_staged_or_fold(self.checkpoint_position + self.buffer_len)
        if count == 1 and self.tokens_seen and ring.size + 1 < self.buffer_len:
            y, records = rec.outputs(self.store.read(), ring.read(), tokens)
            ring.append(records, pending=False)
            return y
        # A flush step (the L-th token since the last boundary), or a multi-token forward: the model's own path,
        # like a prefill, which re-anchors the flush boundaries.
        flush_step = count == 1 and self.tokens_seen > 0
        y = self._absorb(tokens, chunk_fn, ring.read())
        ring.clear()
        self.counters["flushes" if flush_step else "prefills"] += 1
        if not flush_step:
            self.anchor = self.checkpoint_position
        return y

    def _absorb(self, tokens, chunk_fn, history) -> torch.Tensor:
        """Fold ``history`` records and all of ``tokens`` into the checkpoint; return the tokens' outputs."""
        rec = self.recurrence
        count = self._num_tokens(tokens)
        if count > 1 and chunk_fn is not None:
            start = self.store.recurrence()
            if history and next(iter(history.values())).shape[1]:
                start = rec.fold(start, history, self._params, exact=self.store.exact_fold)
            y, state = chunk_fn(0, count, start)
        else:
            y, records = rec.outputs(self.store.read(), history, tokens)
            state = rec.fold(self.store.recurrence(), _cat(history, records), self._params, exact=self.store.exact_fold)
        self.checkpoint_position += _length(history) + count
        self.store.write(state, position=self.checkpoint_position)
        self.counters["checkpoint_writes"] += 1
        return y

    def _fold_oldest(self, count: int) -> None:
        """Fold the ``count`` oldest records into the stored checkpoint."""
        position = self.checkpoint_position + count
        state = self.recurrence.fold(
            self.store.recurrence(), self.ring.read(0, count), self._params, exact=self.store.exact_fold
        )
        self.store.write(state, position=position)
        self.ring.drop_oldest(count)
        self.checkpoint_position = position
        self._staged = {b: st for b, st in self._staged.items() if b > position}
        self.counters["checkpoint_writes"] += 1
        self.counters["flushes"] += 1

    def _base(self, boundary: int):
        """The checkpoint at flush boundary ``boundary``: the stored one, or one staged from buffered records."""
        stored = self.checkpoint_position
        if boundary == stored:
            return self.store
        if boundary not in self._staged:
            previous = self._base(boundary - self.buffer_len)
            records = self.ring.read(boundary - self.buffer_len - stored, self.buffer_len)
            state = self.recurrence.fold(previous.recurrence(), records, self._params, exact=self.store.exact_fold)
            self._staged[boundary] = self.store.stage(state, position=boundary)
            self.counters["staged_checkpoints"] += 1
        return self._staged[boundary]

    def _forward_recording(self, tokens, chunk_fn):
        """Speculative tokens become pending records. Each token reads the checkpoint at its own flush boundary,
        exactly as plain decoding would: when a window crosses a boundary, the checkpoint there is staged from the
        window's earlier records and stored only if the crop keeps them."""
        ring, rec, length = self.ring, self.recurrence, self.buffer_len
        count = self._num_tokens(tokens)
        outputs = []
        # The prompt part of a first forward is never rolled back: it takes the model's own (prefill) path.
        head = self.prompt_part(count) if self.prompt_tokens and self.tokens_seen == 0 else 0
        # Complete periods of committed records are folded (a flush).
        while ring.num_committed >= length:
            self._commit_staged_or_fold(self.checkpoint_position + length)
        excess = ring.size + count - head - ring.capacity
        if excess > 0:
            # The window does not fit: older drafts lose their rollback first, then the head of this forward is
            # absorbed directly (flush boundaries re-anchor there). A later crop reaching past them raises.
            from_pending = min(excess, ring.num_pending)
            if from_pending:
                self._fold_oldest(from_pending)
                self.anchor = self.checkpoint_position
            head += excess - from_pending
        if head:
            outputs.append(self._absorb(rec.slice(tokens, 0, head), chunk_fn, ring.read()))
            ring.clear()
            self._staged = {}
            self.anchor = self.checkpoint_position
            self.counters["prefills"] += 1
        position, index = self.tokens_seen + head, head
        while index < count:
            boundary = self._boundary(position)
            stop = min(count, index + boundary + length - position)
            base = self._base(boundary)
            history = ring.read(boundary - self.checkpoint_position, position - boundary)
            y, records = rec.outputs(base.read(), history, rec.slice(tokens, index, stop))
            ring.append(records, pending=True)
            outputs.append(y)
            position += stop - index
            index = stop
        return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]

    def _commit_staged_or_fold(self, boundary: int) -> None:
        """Make the checkpoint at ``boundary`` the stored one (its staged encodings if any, else a fold)."""
        stored = self.checkpoint_position
        staged = self._staged.get(boundary)
        if staged is None:
            self._fold_oldest(boundary - stored)
            return
        self.store.load(staged)
        self.ring.drop_oldest(boundary - stored)
        self.checkpoint_position = boundary
        self._staged = {b: st for b, st in self._staged.items() if b > boundary}
        self.counters["checkpoint_writes"] += 1
        self.counters["flushes"] += 1

    def finish_forward(self, count: int) -> None:
        """Called once per mixer forward after the replay step ran."""
        if self.tokens_seen:
            self.counters["decode_steps"] += 1
        self.tokens_seen += count
        self.counters["tokens"] += count
        self.has_previous_state[0] = True

    # ------------------------------------------------------------------ rollback and batch ops
    def crop(self, tokens_to_remove: int) -> None:
        count = -int(tokens_to_remove)
        if count < 0:
            raise ValueError(f"ReplayLayer.crop expects a count <= 0 (tokens to drop), got {tokens_to_remove}")
        if count > self.ring.size:
            raise RollbackError(
                f"cannot roll back {count} tokens exactly: only the last {self.ring.size} are still buffered (the "
                "rest was folded into the checkpoint). Pass a larger window, e.g. ReplayCache(window=...), or crop "
                "after every verify step as generate() does."
            )
        if count:
            if self.conv.buffer is not None:
                self.conv.rewind(count, self.conv_kernel)
            self.ring.drop_newest(count)
            self.tokens_seen -= count
            self.counters["rolled_back_tokens"] += count
        self.ring.commit()
        self._resolve_staged()

    def _resolve_staged(self) -> None:
        """After a crop: staged checkpoints whose tokens were all kept become stored; the others are dropped."""
        kept = [b for b in self._staged if b <= self.tokens_seen]
        self._staged = {b: st for b, st in self._staged.items() if b in kept}
        for boundary in sorted(kept):
            self._commit_staged_or_fold(boundary)

    def _index_batch(self, index: torch.Tensor) -> None:
        self.store.index_batch(index)
        self.ring.index_batch(index)
        self.conv.index_batch(index)
        if self.store.allocated:
            self.recurrent_states[0] = self.store.recurrence()
        if self.conv.buffer is not None:
            self.conv_states[0] = self.conv.buffer

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.store.allocated:
            self._index_batch(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.store.allocated:
            batch = self.store.checkpoint.shape[0]
            self._index_batch(torch.arange(batch, device=self.store.checkpoint.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.store.allocated:
            self._index_batch(torch.as_tensor(indices, device=self.store.checkpoint.device).flatten())

    def reset(self) -> None:
        self.store.zero_()
        self.ring.clear()
        if self.conv.buffer is not None:
            self.conv.buffer.zero_()
        self.conv.position = self.conv.oldest = 0
        self.tokens_seen = self.anchor = self.checkpoint_position = 0
        self._staged = {}
        self.has_previous_state[0] = False

    def offload(self) -> None:  # state must stay where the layer runs
        pass

    def prefetch(self) -> None:
        pass

    def nbytes(self) -> dict[str, int]:
        sizes = self.store.nbytes()
        sizes["buffer"] = self.ring.nbytes()
        sizes["conv"] = self.conv.nbytes()
        return sizes


class ReplayHybridLayer(ReplayLayer, DynamicLayer):
    """A layer with both an SSM state and attention K/V (falcon_h1, zamba2 hybrid blocks)."""

    def __init__(self, buffer_len: int, window: int, policy: PrecisionPolicy | list[PrecisionPolicy],
                 layer_idx: int = 0, number_of_states: int = 1, **kwargs):
        DynamicLayer.__init__(self)
        ReplayLayer.__init__(self, buffer_len, window, policy, layer_idx, number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if len(args) == 2 and not kwargs:  # attention K/V
            DynamicLayer.lazy_initialization(self, *args)

    def get_seq_length(self) -> int:
        return DynamicLayer.get_seq_length(self)

    def crop(self, tokens_to_remove: int) -> None:
        ReplayLayer.crop(self, tokens_to_remove)
        if int(tokens_to_remove):
            DynamicLayer.crop(self, int(tokens_to_remove))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        ReplayLayer.reorder_cache(self, beam_idx)
        DynamicLayer.reorder_cache(self, beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        ReplayLayer.batch_repeat_interleave(self, repeats)
        DynamicLayer.batch_repeat_interleave(self, repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        ReplayLayer.batch_select_indices(self, indices)
        DynamicLayer.batch_select_indices(self, indices)

    def reset(self) -> None:
        ReplayLayer.reset(self)
        DynamicLayer.reset(self)
