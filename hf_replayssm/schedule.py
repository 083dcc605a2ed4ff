"""The ReplaySSM schedule of one SSM layer (pure torch: no transformers import).

``ReplaySchedule`` owns the checkpoint store, the record ring, the conv-input ring, the token positions and the
staged checkpoints of one layer, and decides per forward what to read, append, fold and write. The transformers
cache layer (``layers.ReplayLayer``) is a thin adapter around it; kernels will replace the math it calls, not the
schedule.

The schedule (L = ``buffer_len``):

* prefill (any plain multi-token forward): the model's own chunked path runs from the checkpoint and writes the
  final state; the ring is empty. Flush boundaries sit every L tokens from there (the *anchor*).
* a decode step reads checkpoint + ring and appends one record (no state write); the step that reaches the next
  boundary flushes: the ring and the token are folded into the checkpoint. So the ring holds at most L - 1
  committed records.
* while recording (speculative decoding) new tokens are *pending* records. Each token still reads the checkpoint
  of its own boundary; when a window crosses a boundary that checkpoint is staged from the window's records and
  stored only if the crop keeps them. ``crop(r)`` drops the newest r records and rewinds the conv window (pointer
  moves) and commits the rest. A window larger than the ring grows the ring (never folds a draft), so the flush
  grid never moves and generation never fails half-way. The first forward of an empty cache is its prompt (the
  prefill path), unless ``prompt_tokens`` announced a shorter prompt (transformers' first assisted round feeds the
  prompt and the first drafts together); without an announcement its last ``window`` tokens stay rewindable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping

import torch

from .buffers import ConvRing, RecordRing
from .precision import CheckpointStore, PrecisionPolicy
from .static_decode import DevicePositions, mark_static

VERIFY_MAX_WINDOW = 16  # tokens per launch of the Triton verify kernels (their window loop is unrolled)

ChunkFn = Callable[[int, int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class RollbackError(ValueError):
    """A ``crop`` asked for more than the cache can undo exactly."""


def _length(records: Mapping[str, torch.Tensor]) -> int:
    return next(iter(records.values())).shape[1] if records else 0


def _cat(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Records ``a`` followed by ``b`` (the fields of ``a``: ``b`` may carry more than a ring keeps)."""
    if not a or _length(a) == 0:
        return dict(b)
    return {name: torch.cat([a[name], b[name].to(a[name].dtype)], dim=1) for name in a}


class ReplaySchedule:
    """Checkpoint, record ring, conv ring and positions of one SSM layer.

    Args:
        recurrence: a ``recurrences`` family (what a token records, how outputs are read, how records fold).
        buffer_len: L, records per flush period (1 = plain step decoding).
        window: record slots reserved for speculative windows beyond the L - 1 committed ones.
        policy: a ``PrecisionPolicy`` or one per batch row.
        layer_idx: seeds stochastic rounding per layer.
    """

    def __init__(self, recurrence, buffer_len: int, window: int, policy: PrecisionPolicy | list[PrecisionPolicy],
                 layer_idx: int = 0):
        self.recurrence = recurrence
        self.buffer_len = buffer_len
        self.window = window
        self.ring = RecordRing(self._ring_capacity(window))
        self.conv = ConvRing(0)
        self.conv_kernel: int | None = None
        self.store = CheckpointStore(policy, seed_offset=layer_idx)
        self.recording = False
        self.tokens_seen = 0
        self.prompt_tokens = 0  # announced prompt length (generate() with speculation); 0 = the first forward
        self._prompt_len = 0
        self.counters: Counter = Counter()
        self.checkpoint_position = 0  # tokens folded into the stored checkpoint
        self.anchor = 0  # position of the last prefill; flush boundaries sit at anchor + k * buffer_len
        self._staged: dict = {}  # boundary position -> StagedCheckpoint inside pending speculative records
        self._params: dict[str, object] = {}  # per-layer constants of the last call (e.g. Mamba-2's A)
        self.backend = "torch"  # "triton": plain decode steps run the family's fused kernel where it applies
        self.kernel_windows = 0  # speculative window pieces that ran the Triton verify kernel (not in stats())
        self.kernel_folds = 0  # staged or left-over checkpoints folded by the Triton fold kernel (not in stats())
        self.kernel_flushes = 0  # plain decode flush steps that ran the Triton step kernel (not in stats())
        self._position_memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # verify launches' positions
        self.device: torch.device | None = None
        self.batch_size: int | None = None
        self.state_shape: tuple[int, ...] | None = None
        # A static cache (compileable decoding): plain decode steps keep their positions on the device
        self.static = False
        self.device_positions = DevicePositions()
        # ... and speculative windows too, while transformers' assisted loop drives it (one window, then its crop)
        self.device_verify = False

    def _ring_capacity(self, window: int) -> int:
        return max(1, self.buffer_len - 1 + window)

    # ------------------------------------------------------------------ views
    @property
    def allocated(self) -> bool:
        return self.store.allocated

    def checkpoint(self) -> torch.Tensor | None:
        """The state the recurrence continues from (float32; the stored tensor itself for an fp32 checkpoint, which
        device positions hold at hand: see ``DevicePositions.operands``)."""
        if self.device_positions.is_active():
            return self.device_positions.operands[0]
        return self.store.recurrence() if self.store.allocated else None

    def current_state(self) -> torch.Tensor | None:
        """The full recurrent state after every buffered record, materialised (for checks and stock views)."""
        if not self.store.allocated:
            return None
        self.leave_device_positions()
        return self.recurrence.fold(self.store.recurrence(), self.ring.read(), self._params, exact=True)

    def state_numel(self) -> int:
        """Elements of the full recurrent state (all batch rows)."""
        if self.state_shape is None:
            return 0
        return self.batch_size * int(torch.Size(self.state_shape[1:]).numel())

    def conv_window(self) -> torch.Tensor | None:
        """The last ``conv_kernel`` conv inputs [B, C, K], the stock layout of a conv state."""
        if self.device_positions.is_active():
            return self.device_positions.conv.clone()
        return None if self.conv.buffer is None else self.conv.window(self.conv_kernel).clone()

    def max_rollback(self) -> int:
        """The deepest ``crop`` this layer can undo exactly now."""
        self.leave_device_positions()
        depth = self.ring.size
        if self.conv.buffer is not None:
            depth = min(depth, self.conv.rewindable(self.conv_kernel))
        return depth

    # ------------------------------------------------------------------ allocation
    def _ensure_conv(self, like: torch.Tensor, kernel: int) -> None:
        if self.conv.buffer is not None and self.conv.buffer.shape[0] != like.shape[0]:  # kept by a static reset
            self.conv = ConvRing(0)
        if self.conv.buffer is None:
            self.conv_kernel = kernel
            self.conv = ConvRing(kernel + self.window)
            self.conv.allocate(like)

    def _ensure_state(self, tokens: Mapping[str, torch.Tensor]) -> None:
        example = next(v for v in tokens.values() if isinstance(v, torch.Tensor))
        if self.store.allocated and example.shape[0] != self.batch_size:  # kept by a static reset, another batch
            self.store = CheckpointStore(self.store.policies, seed_offset=self.store.seed_offset)
            self.ring = RecordRing(self.ring.capacity)
        if not self.store.allocated:
            device = example.device
            shape = self.recurrence.state_shape(tokens)
            self.store.allocate(shape, device)
            self.device, self.batch_size, self.state_shape = device, shape[0], shape
            self.ring.allocate(self.recurrence.record_examples(tokens, exact=self.store.exact_fold))

    def reserve_window(self, window: int) -> None:
        """Keep speculative windows of ``window`` tokens exact without growing later (growth is automatic)."""
        if window > self.window:
            self.leave_device_positions()
            self.window = window
            self.ring.grow(self._ring_capacity(window))
            if self.conv.buffer is not None:
                self.conv.grow(self.conv_kernel + window)

    def _head(self, count: int) -> int:
        """Leading tokens of a recording forward that take the prefill path (never rolled back): the announced
        prompt of a first forward; without an announcement (a draft model's cache, manual use) all of a first
        forward but its last ``window`` tokens, which stay rewindable (transformers re-feeds the last prompt token
        of a draft model after its first round)."""
        if self.tokens_seen:
            return 0
        prompt = self.prompt_part(count)
        if self.prompt_tokens:
            return prompt
        return count - min(self.window, count - 1)

    def prompt_part(self, count: int) -> int:
        """How many leading tokens of a forward of ``count`` tokens are prompt (prefill) rather than generated.
        The prompt is the first ``prompt_tokens`` tokens when generate() announced them, else the first forward;
        a prompt token fed again after a rollback is still a prompt token."""
        if self.device_positions.is_verifying():  # (maybe compiled) verify forward: generated tokens only
            return 0
        self.leave_device_positions()
        if self.tokens_seen == 0 and not self.prompt_tokens:
            self._prompt_len = count
        prompt_len = self.prompt_tokens or self._prompt_len
        return max(0, min(prompt_len - self.tokens_seen, count))

    # ------------------------------------------------------------------ the conv window
    def conv_update(self, inputs: torch.Tensor, kernel: int) -> torch.Tensor:
        """``[history, inputs]`` ([B, C, K + T]) for the model's own causal conv; remembers the new inputs."""
        positions = self.device_positions
        if positions.is_active():
            if positions.is_verifying() and inputs.shape[-1] <= positions.verify_window:
                return positions.conv_verify(inputs)
            if inputs.shape[-1] == 1 and not self.recording:
                return positions.conv_step(inputs)
            self.leave_device_positions()
        self._ensure_conv(inputs, kernel)
        if self.recording:  # every speculative token must stay rewindable until the crop
            count = inputs.shape[-1]
            self.conv.grow(kernel + self.ring.num_pending + count - self._head(count))
        full = torch.cat([self.conv.window(kernel).to(inputs.dtype), inputs], dim=-1)
        self.conv.write(inputs)
        return full

    # ------------------------------------------------------------------ the replay step
    def forward_tokens(self, tokens: Mapping[str, torch.Tensor], chunk_fn: ChunkFn | None = None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Outputs [B, T, ...] of T new tokens (in ``out_dtype``, default float32); updates ring and checkpoint."""
        positions = self.device_positions
        if positions.is_active():
            if positions.verifies(tokens):
                y = positions.verify(tokens)
                return y if out_dtype is None else y.to(out_dtype)
            if positions.takes(tokens) and not self.recording:
                return positions.step(tokens, out_dtype)
            self.leave_device_positions()
        self._ensure_state(tokens)
        self._params = {k: v for k, v in tokens.items() if k not in self.recurrence.per_token}
        dtype = out_dtype or torch.float32
        if self.recording:
            return self._forward_recording(tokens, chunk_fn, dtype)
        self.ring.commit()
        return _join(self._forward_plain(tokens, chunk_fn, dtype), dtype)

    def _num_tokens(self, tokens: Mapping[str, torch.Tensor]) -> int:
        return tokens[self.recurrence.per_token[0]].shape[1]

    def _boundary(self, position: int) -> int:
        """The flush boundary a token at ``position`` reads from: the anchor (last prefill) plus a multiple of L."""
        return self.anchor + (position - self.anchor) // self.buffer_len * self.buffer_len

    def _forward_plain(self, tokens, chunk_fn, out_dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        ring, rec = self.ring, self.recurrence
        count = self._num_tokens(tokens)
        while ring.size >= self.buffer_len:  # complete periods left by speculative decoding
            self._commit_staged_or_fold(self.checkpoint_position + self.buffer_len)
        if count == 1 and self.tokens_seen and self._kernel_applies():
            return [self._kernel_step(tokens, out_dtype)]
        if "dt_softplus" in self._params:
            raise RuntimeError("raw kernel inputs reached a non-kernel step (next_step_uses_kernel was wrong)")
        if count == 1 and self.tokens_seen and ring.size + 1 < self.buffer_len:
            y, records = rec.outputs(self.store.read(), ring.read(), tokens, self._params)
            ring.append(records, pending=False)
            return [y]
        # A flush step (the L-th token since the last boundary), or a multi-token forward: the model's own path,
        # like a prefill, which re-anchors the flush boundaries.
        flush_step = count == 1 and self.tokens_seen > 0
        y = self._absorb(tokens, chunk_fn, ring.read())
        ring.clear()
        self.counters["flushes" if flush_step else "prefills"] += 1
        if not flush_step:
            self.anchor = self.checkpoint_position
        return [y]

    # ------------------------------------------------------------------ the fused kernel step
    def next_step_uses_kernel(self, count: int) -> bool:
        """Whether a forward of ``count`` tokens now would be one decode step through the family's kernel (an
        adapter may then hand the kernel raw inputs it processes itself, e.g. Mamba-2's dt before softplus)."""
        if self.device_positions.is_active():  # read no host position: this may run inside a compiled step
            return count == 1 and not self.recording
        return count == 1 and not self.recording and self.tokens_seen > 0 and self._kernel_applies()

    def _kernel_operands(self, entry: str):
        """The store's kernel operands when the Triton backend runs and the recurrence has the kernel entry point
        ``entry``; else None."""
        if self.backend != "triton" or getattr(self.recurrence, entry, None) is None:
            return None
        return self.store.kernel_operands()

    def _fp32_kernel_applies(self, entry: str) -> bool:
        """Whether the kernel entry point ``entry`` runs here on the float32 checkpoint with no read copy (the
        speculative kernels: separated policies take the torch reference, whose outputs read the copy)."""
        operands = self._kernel_operands(entry)
        return operands is not None and operands[1] is None

    def _kernel_applies(self) -> bool:
        # Separated precision: every step's output reads the fp8 / nvfp4 copy in the kernel, a flush step's too (the
        # reference's semantics; the flush-only launch then reads the copy for the outputs and folds into the fp32
        # checkpoint), and the kernel step re-encodes the copy after the flush (reencode_copy, every family).
        return self._kernel_operands("kernel_step") is not None

    def _kernel_step(self, tokens, out_dtype: torch.dtype) -> torch.Tensor:
        """One plain decode token through the family's replay-or-flush kernel. Every row is at the host's position
        (plain decoding keeps the rows in step), so the launch is the kernel specialised to this step's phase."""
        ring = self.ring
        state, read_copy, read_format = self.store.kernel_operands()
        y = self.recurrence.kernel_step(state, ring.fields, ring.origin, ring.num_committed, tokens, self._params,
                                        self.buffer_len, out_dtype, read_copy=read_copy, read_format=read_format)
        if ring.num_committed + 1 < self.buffer_len:
            ring.num_committed += 1
        else:  # the kernel flushed: records and token folded into the checkpoint in place (and the read copy
            # re-encoded by the step, reencode_copy)
            self.kernel_flushes += 1
            ring.restart()
            self.checkpoint_position += self.buffer_len
            self.counters["flushes"] += 1
            self.counters["checkpoint_writes"] += 1
        return y

    def _absorb(self, tokens, chunk_fn, history) -> torch.Tensor:
        """Fold ``history`` records and all of ``tokens`` into the checkpoint; return the tokens' outputs."""
        rec = self.recurrence
        count = self._num_tokens(tokens)
        exact = self.store.exact_fold
        if count > 1 and chunk_fn is not None:
            start = self.store.recurrence()
            if _length(history):
                start = rec.fold(start, history, self._params, exact=exact)
            y, state = chunk_fn(0, count, start)
        else:
            y, records = rec.outputs(self.store.read(), history, tokens, self._params)
            state = rec.fold(self.store.recurrence(), _cat(history, records), self._params, exact=exact)
        self.checkpoint_position += _length(history) + count
        self.store.write(state, position=self.checkpoint_position)
        self.counters["checkpoint_writes"] += 1
        return y

    def _fold_oldest(self, count: int) -> None:
        """Fold the ``count`` oldest records into the stored checkpoint."""
        position = self.checkpoint_position + count
        if self._kernel_fold_applies():  # in place on the float32 checkpoint, one launch
            state = self.store.kernel_operands()[0]
            self.recurrence.kernel_fold(state, self.ring.fields, self.ring.origin, count, self._params, out=state)
            self.kernel_folds += 1
        else:
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
            offset = boundary - self.buffer_len - stored
            if self._kernel_fold_applies():  # a new float32 tensor, one launch
                state = self.recurrence.kernel_fold(previous.recurrence(), self.ring.fields,
                                                    (self.ring.origin + offset) % self.ring.capacity,
                                                    self.buffer_len, self._params)
                self.kernel_folds += 1
            else:
                records = self.ring.read(offset, self.buffer_len)
                state = self.recurrence.fold(previous.recurrence(), records, self._params,
                                             exact=self.store.exact_fold)
            self._staged[boundary] = self.store.stage(state, position=boundary)
            self.counters["staged_checkpoints"] += 1
        return self._staged[boundary]

    def _forward_recording(self, tokens, chunk_fn, dtype: torch.dtype) -> torch.Tensor:
        """Speculative tokens become pending records. Each token reads the checkpoint at its own flush boundary,
        exactly as plain decoding would: when a window crosses a boundary, the checkpoint there is staged from the
        window's earlier records and stored only if the crop keeps them."""
        ring, rec, length = self.ring, self.recurrence, self.buffer_len
        count = self._num_tokens(tokens)
        outputs = []
        out = None  # where the verify kernels run: one [B, T, ...] output in ``dtype`` that every piece writes into
        if self._fp32_kernel_applies("kernel_verify"):
            shaped = tokens[rec.output_like]
            out = torch.empty(shaped.shape, dtype=dtype, device=shaped.device)

        def emit(start: int, stop: int, y: torch.Tensor) -> None:
            if out is None:
                outputs.append(y)
            else:
                out[:, start:stop].copy_(y)

        head = self._head(count)  # the prompt part of a first forward is never rolled back: the prefill path
        while ring.num_committed >= length:  # complete periods of committed records: a flush
            self._commit_staged_or_fold(self.checkpoint_position + length)
        needed = ring.size + count - head
        if needed > ring.capacity:  # a larger window than reserved: grow, never fold drafts (the grid stays)
            self.reserve_window(needed - (length - 1))
        if head:
            emit(0, head, self._absorb(rec.slice(tokens, 0, head), chunk_fn, ring.read()))
            ring.clear()
            self._staged = {}
            self.anchor = self.checkpoint_position
            self.counters["prefills"] += 1
        position, index = self.tokens_seen + head, head
        while index < count:
            boundary = self._boundary(position)
            stop = min(count, index + boundary + length - position)
            if self._verify_kernel_applies(boundary, position, stop - index):  # writes its slice of out
                self._kernel_verify(rec.slice(tokens, index, stop), boundary, out[:, index:stop])
            else:
                base = self._base(boundary)
                history = ring.read(boundary - self.checkpoint_position, position - boundary)
                y, records = rec.outputs(base.read(), history, rec.slice(tokens, index, stop), self._params)
                ring.append(records, pending=True)
                emit(index, stop, y)
            position += stop - index
            index = stop
        return _join(outputs, dtype) if out is None else out

    def _verify_kernel_applies(self, boundary: int, position: int, count: int) -> bool:
        """Whether the window piece of ``count`` tokens at ``position`` can run the family's Triton verify kernel:
        the Triton backend, one fp32 checkpoint policy without a read copy (separated policies take the reference,
        whose outputs read the copy), every record since the stored checkpoint in the ring before the piece, at
        most 16 tokens, and as the piece's base the stored checkpoint or, past a flush boundary, a staged one that
        the fold kernel computes (a float32 tensor)."""
        if not (1 <= count <= VERIFY_MAX_WINDOW) or not self.ring.allocated:
            return False
        if self.ring.size != position - self.checkpoint_position or self.ring.size + count > self.ring.capacity:
            return False
        if boundary != self.checkpoint_position and not self._kernel_fold_applies():
            return False
        return self._fp32_kernel_applies("kernel_verify")

    def _window_positions(self, origin: int, count: int, batch: int, device: torch.device):
        """Per-row int32 ``origin`` / ``count`` tensors (every row alike) for a verify launch, kept per value: the
        positions recur (at most ring capacity squared pairs), so a verify forward launches no fills for them."""
        key = (origin, count, batch, device)
        tensors = self._position_memo.get(key)
        if tensors is None:
            tensors = (torch.full((batch,), origin, dtype=torch.int32, device=device),
                       torch.full((batch,), count, dtype=torch.int32, device=device))
            self._position_memo[key] = tensors
        return tensors

    def _kernel_fold_applies(self) -> bool:
        """Whether folds run the family's fold kernel: the verify kernels' conditions (one fp32 checkpoint policy,
        no read copy: then the recorded d's are what a fold needs, no exact recomputation) and an allocated ring."""
        return self._fp32_kernel_applies("kernel_fold") and self.ring.allocated and not self.store.exact_fold

    def _kernel_verify(self, tokens, boundary: int, out: torch.Tensor) -> torch.Tensor:
        """Outputs of a window piece (into ``out``, in its dtype) from the checkpoint at ``boundary`` (the stored one,
        or one staged by the fold kernel) and the records after it, its records appended as pending, in one launch
        of the family's verify kernel (no state write; the positions are handed to it as per-row device tensors, all
        rows at the host's position)."""
        ring = self.ring
        offset = boundary - self.checkpoint_position
        state = self.store.kernel_operands()[0] if offset == 0 else self._base(boundary).recurrence()
        origin, count = self._window_positions((ring.origin + offset) % ring.capacity, ring.size - offset,
                                               state.shape[0], state.device)
        y = self.recurrence.kernel_verify(state, ring.fields, origin, count, tokens, self._params, out=out)
        ring.extend(self._num_tokens(tokens), pending=True)
        self.kernel_windows += 1
        return y

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
        """Called once per mixer forward after the replay step ran (eagerly: a compiled step skips it)."""
        if self.device_positions.is_active():  # the device counted the step
            return
        self._finish_host_forward(count)
        if self._device_positions_apply():
            self._enter_device_positions()

    def _finish_host_forward(self, count: int) -> None:
        if self.tokens_seen:
            self.counters["decode_steps"] += 1
        self.tokens_seen += count
        self.counters["tokens"] += count

    # ------------------------------------------------------------------ device positions (static caches)
    def device_positions_supported(self) -> bool:
        """Whether this layer's family and precision policy can decode on device positions at all."""
        if getattr(self.recurrence, "device_step", None) is None or len(set(self.store.policies)) != 1:
            return False
        policy = self.store.policies[0]
        return policy.checkpoint_format == "fp32" and policy.read_format in (None, "fp8", "nvfp4")

    def device_verify_supported(self) -> bool:
        """Whether speculative windows of this layer can run on device positions (see ``_device_verify_applies``),
        from its family and policy alone (before anything is allocated)."""
        return (self.device_positions_supported() and getattr(self.recurrence, "device_verify", None) is not None
                and self.store.policies[0].read_format is None)

    def _device_positions_apply(self) -> bool:
        """Whether plain decode steps from here can run on device positions: a static cache's layer after its
        prefill, outside speculation, whose family has a decode-step op for this store (float32 checkpoint, no read
        copy or an fp8 / nvfp4 one) and whose ring holds less than a period."""
        if not self.static or not self.store.allocated or not self.tokens_seen:
            return False
        if self.recording and not self._device_verify_applies():
            return False
        if not self.device_positions_supported() or self._staged or self.ring.num_pending:
            return False
        return self.ring.size < self.buffer_len

    def _device_verify_applies(self) -> bool:
        """Whether speculative windows can run on device positions (``device_verify``, set while transformers'
        assisted loop drives a static cache): the family has a verify op and the store a float32 checkpoint without
        a read copy (the verify ops read no copy)."""
        return (self.device_verify and getattr(self.recurrence, "device_verify", None) is not None
                and self.store.kernel_operands()[1] is None)

    def _enter_device_positions(self) -> None:
        from .kernels import ops  # noqa: F401  (registers the decode-step ops before any trace sees them)

        verify_fn = self.recurrence.device_verify if self.recording else None
        window = None if self.conv.buffer is None else self.conv.window(self.conv_kernel)
        operands = self.store.kernel_operands()
        self.device_positions.enter(self.ring.origin, self.ring.num_committed, self.batch_size, self.device, window,
                                    operands, self.ring.fields, self.recurrence.device_step, self.buffer_len,
                                    self.recurrence.per_token[0], verify_fn=verify_fn, verify_window=self.window)
        state, read_copy, _ = operands
        mark_static(state, *(read_copy or {}).values(), *self.ring.fields.values())  # written in place by the op

    def _device_progress(self) -> tuple[int, int]:
        """(steps, flushes) since the device positions took over (reads the device)."""
        steps = self.device_positions.steps_taken()
        return steps, (self.device_positions.entry_committed + steps) // self.buffer_len

    def current_tokens_seen(self) -> int:
        """Tokens fed so far, the steps on device positions included (which the host fields leave out)."""
        if not self.device_positions.is_active():
            return self.tokens_seen
        if self.device_positions.is_verifying():
            return self.tokens_seen + self.device_positions.progress()[1]
        return self.tokens_seen + self._device_progress()[0]

    def current_counters(self) -> Counter:
        """The counters, the steps on device positions included."""
        if not self.device_positions.is_active():
            return self.counters
        if self.device_positions.is_verifying():
            windows, width, dropped, _ = self.device_positions.ledger()
            return self.counters + Counter(decode_steps=windows if self.tokens_seen else 0, tokens=width + dropped,
                                           rolled_back_tokens=dropped)
        steps, flushes = self._device_progress()
        return self.counters + Counter(decode_steps=steps, tokens=steps, flushes=flushes, checkpoint_writes=flushes)

    def leave_device_positions(self) -> None:
        """Hand the positions back to the host schedule (before anything that reads them)."""
        positions = self.device_positions
        if not positions.is_active():
            return
        if positions.is_verifying():
            self._leave_verifying_positions()
            return
        steps, flushes = self._device_progress()
        committed = (positions.entry_committed + steps) % self.buffer_len
        if not bool((positions.count == committed).all()):
            raise RuntimeError(f"device positions disagree with the step count ({steps} steps, expected {committed} "
                               f"records per row, found {positions.count.tolist()})")
        self.counters.update(decode_steps=steps, tokens=steps, flushes=flushes, checkpoint_writes=flushes)
        self.tokens_seen += steps
        self.ring.num_committed = committed
        self.checkpoint_position += flushes * self.buffer_len
        if positions.conv is not None:
            self.conv.load_window(positions.conv, self.tokens_seen)
        positions.leave()

    def _leave_verifying_positions(self) -> None:
        """Hand back positions that verified a window: its records become pending records of the host ring (the op
        wrote them after the committed ones) and its conv inputs the conv ring's newest, so ``crop`` commits or drops
        them as after a host verify forward."""
        positions = self.device_positions
        windows, width, dropped, errors = positions.ledger()
        if errors:
            positions.leave()
            raise RuntimeError(f"{errors} crop(s) on device positions kept more tokens than their verify window fed: "
                               "crop only within the window just verified (the assisted loop does)")
        if windows > 1 or not bool((positions.count == self.ring.num_committed).all()):
            raise RuntimeError(f"device positions verified {windows} windows without a crop (count "
                               f"{positions.count.tolist()}, expected {self.ring.num_committed}): the assisted loop "
                               "crops after every verify forward")
        self.counters.update(tokens=dropped, rolled_back_tokens=dropped)
        positions.leave()
        if not windows:
            if positions.committed_here and positions.conv is not None:  # the conv ring missed the crops' windows
                self.conv.load_window(positions.conv, self.tokens_seen)
            return
        self.ring.extend(width, pending=True)
        if positions.conv_hist is not None:
            self.conv.load_window(positions.conv_hist[..., : self.conv_kernel + width], self.tokens_seen + width)
        self._finish_host_forward(width)

    # ------------------------------------------------------------------ speculation and rollback
    def activate_recording(self) -> None:
        self.leave_device_positions()
        self.recording = True

    def deactivate_recording(self) -> None:
        self.leave_device_positions()
        self.recording = False
        self.ring.commit()
        self._resolve_staged()

    def check_rollback(self, count: int) -> None:
        """Raise ``RollbackError`` (changing nothing) unless the newest ``count`` tokens can be dropped exactly."""
        depth = self.max_rollback()
        if count > depth:
            raise RollbackError(
                f"cannot roll back {count} tokens exactly: only the last {depth} can be undone (older tokens are "
                "folded into the checkpoint, and only tokens fed while recording keep their conv inputs). Call "
                "activate_past_recording() before feeding tokens you may drop, and crop after every verify step as "
                "generate() does."
            )

    def kept_on_device(self, count: int) -> int | None:
        """How many tokens of the window verified on device positions a ``crop`` keeps, where the host can tell
        without reading the device and the crop can commit them there (``ReplayCache._crop_on_device``); else
        None. ``count``: as ``ReplayCache.crop`` takes it, a length to keep (> 0) or minus the tokens to drop, which
        needs the window's width as the host saw it (``DevicePositions.fed``). A crop that completes a period (then
        folded by ``crop_on_device``) or keeps more tokens than the window fed (then refused at once by the host
        way) needs that width too; without it, a length past the window is counted on the device (``errors``) and
        raised when the positions are handed back."""
        positions = self.device_positions
        if not positions.is_verifying() or self._staged or self.ring.num_pending:
            return None
        if count > 0:
            kept = count - self.tokens_seen
        elif positions.fed is not None:
            kept = positions.fed + count
        else:
            return None
        if not 0 <= kept <= positions.verify_window:
            return None
        if positions.fed is None:
            return kept if self.ring.num_committed + kept < self.buffer_len else None
        return kept if kept <= positions.fed else None

    def crop_on_device(self, kept: int) -> None:
        """The crop after a window verified on device positions that keeps ``kept`` tokens (``kept_on_device``), on
        the host schedule's side: the caller commits them on the device, for every layer at once
        (``static_decode.commit_windows``), and the positions stay (no host read). A crop that completes a period
        folds it here, as the host way would (the fold kernel on the ring's host-known origin: one launch a layer),
        and points the device positions at the ring's new origin."""
        if self.tokens_seen:
            self.counters["decode_steps"] += 1
        self.counters["tokens"] += kept
        self.tokens_seen += kept
        self.ring.num_committed += kept
        if self.ring.num_committed >= self.buffer_len:
            while self.ring.num_committed >= self.buffer_len:
                self._commit_staged_or_fold(self.checkpoint_position + self.buffer_len)
            self.device_positions.restart(self.ring.origin, self.ring.num_committed)

    def crop(self, count: int) -> None:
        """Drop the newest ``count`` tokens and commit the rest."""
        self.leave_device_positions()
        self.check_rollback(count)
        if count:
            if self.conv.buffer is not None:
                self.conv.rewind(count, self.conv_kernel)
            self.ring.drop_newest(count)
            self.tokens_seen -= count
            self.counters["rolled_back_tokens"] += count
        self.ring.commit()
        self._resolve_staged()
        if self.recording and self.static and self._device_verify_applies() and self.store.allocated:
            # the next window verifies on device positions (maybe compiled): fold complete periods now, as the next
            # host forward would
            while self.ring.num_committed >= self.buffer_len:
                self._commit_staged_or_fold(self.checkpoint_position + self.buffer_len)
            if self._device_positions_apply():
                self._enter_device_positions()

    def check_drop_rows(self, dropped: list[int], most: int | None = None) -> None:
        """Raise (changing nothing) unless ``drop_rows_newest(dropped)`` can drop exactly what it is asked to.
        ``most``: ``max(dropped)``, when the caller has it."""
        if len(dropped) != self.batch_size:
            raise ValueError(f"dropped counts for {len(dropped)} rows, the cache holds {self.batch_size}")
        most = max(dropped, default=0) if most is None else most
        if most and most > (depth := min(self.ring.num_pending, self.max_rollback())):  # (conv window included)
            raise RollbackError(f"a row cannot drop {most} tokens, only the last {depth} fed while recording "
                                "(activate_past_recording) can be dropped")
        if most and self.store.allocated and getattr(self.recurrence, "neutral_record", None) is None:
            raise RollbackError(f"{self.recurrence.name} records have no neutral form: per-row rollback is not "
                                "supported")

    def drop_rows_newest(self, dropped: list[int], memo: dict | None = None, packed: bool = False,
                         checked: tuple[int, int] | None = None) -> None:
        """Per-row rollback (batched speculation): row r forgets its newest ``dropped[r]`` pending tokens, which stay
        in the ring as neutral records (they leave the state exactly as it is), so every row keeps the shared
        position and flush grid; the conv window of each such row is moved back over its dropped inputs. Then every
        pending record is committed, like ``crop``. ``memo``: one dict for all layers of one rollback, in which
        their rings share masks and index tensors (``buffers.shared_index``). ``packed``: a ``PackedRollback``
        already wrote the neutral records and moved the conv window of every layer; only the positions are left.
        ``checked``: ``(max(dropped), sum(dropped))`` from a caller that ran ``check_drop_rows`` (a cache rolls back
        every layer in one pass and does the per-call work once)."""
        self.leave_device_positions()
        if checked is None:
            self.check_drop_rows(dropped)
            checked = max(dropped, default=0), sum(dropped)
        most, total = checked
        if most:
            if self.conv.buffer is not None:
                if packed:
                    self.conv.keep_window_only(self.conv_kernel)
                else:
                    self.conv.compact_rows(dropped, self.conv_kernel, memo)
            if self.store.allocated:
                if not packed:
                    self.ring.overwrite_newest(dropped, dict(self.recurrence.neutral_record), memo)
                if self._staged:  # staged checkpoints from neutralised records are stale
                    first = self.tokens_seen - most
                    self._staged = {b: st for b, st in self._staged.items() if b <= first}
            self.counters["rolled_back_tokens"] += total
        self.ring.commit()
        self._resolve_staged()

    def _resolve_staged(self) -> None:
        """After a crop: staged checkpoints whose tokens were all kept become stored; the others are dropped."""
        if not self._staged:
            return
        kept = [b for b in self._staged if b <= self.tokens_seen]
        self._staged = {b: st for b, st in self._staged.items() if b in kept}
        for boundary in sorted(kept):
            self._commit_staged_or_fold(boundary)

    def clear_keeping_storage(self) -> None:
        """Forget every token but keep every tensor (a static cache's reset: compiled graphs and CUDA graphs keep
        their addresses). The next forward of the same batch size writes into the same storage."""
        self.device_positions.leave()
        self.ring.clear()
        self.conv.clear()
        if self.store.allocated:
            self.store.zero_()
        self.recording = False
        self.tokens_seen = self._prompt_len = self.checkpoint_position = self.anchor = 0
        self.counters.clear()
        self._staged, self._params = {}, {}

    # ------------------------------------------------------------------ batch rows
    def index_batch(self, index: torch.Tensor) -> None:
        """Keep / reorder / repeat batch rows (beam search, contrastive search, ``batch_select_indices``)."""
        if self._staged:
            raise RuntimeError("batch rows cannot be reordered inside a speculative window; crop first")
        self.leave_device_positions()
        self.store.index_batch(index)
        self.ring.index_batch(index)
        self.conv.index_batch(index)
        self.batch_size = int(index.numel())

    # ------------------------------------------------------------------ memory
    def nbytes(self, exclude: set[int] = frozenset()) -> dict[str, int]:
        """Bytes per component; ``params`` counts the per-layer constants held (and the verify launches' position
        tensors), except storages in ``exclude`` (e.g. the model's own parameters, which the cache does not keep
        alive)."""
        sizes = self.store.nbytes()
        sizes["buffer"] = self.ring.nbytes()
        sizes["conv"] = self.conv.nbytes()
        sizes["staged"] = sum(_storage_bytes(_staged_tensors(st)) for st in self._staged.values())
        held = [v for v in self._params.values() if isinstance(v, torch.Tensor)]
        held += [t for pair in self._position_memo.values() for t in pair]  # verify launches' position tensors
        sizes["params"] = _storage_bytes(v for v in held if v.untyped_storage().data_ptr() not in exclude)
        return sizes


def _join(pieces: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Outputs of consecutive pieces of a forward [B, T_i, ...] as one [B, T, ...] tensor in ``dtype``."""
    if len(pieces) == 1:
        return pieces[0].to(dtype)
    return torch.cat([piece.to(dtype) for piece in pieces], dim=1)


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _staged_tensors(staged) -> Iterator[torch.Tensor]:
    for encodings in staged.encodings:
        for encoding in encodings:
            if encoding:
                yield from encoding.values()
