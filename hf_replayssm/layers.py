"""transformers cache layers around a ``ReplaySchedule``.

``ReplayLayer`` is what ``ReplayCache.layers[i]`` holds for an SSM layer: a ``LinearAttentionLayer`` (so stock code
finds the attributes it reads) whose work is done by the transformers-free ``schedule.ReplaySchedule``.

Stock views: ``recurrent_states[0]`` and ``conv_states[0]`` (what transformers' own code and cache API read) are
materialised on access outside a replay call: the current recurrent state (checkpoint + every buffered record,
folded) and the last ``K`` conv inputs in the stock ``[B, C, K]`` layout. Inside a replay call, where the mixer only
hands them back to the replay path, they cost nothing (the checkpoint and the conv window). They are copies: writing
into them does not change the cache.
"""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicLayer, LinearAttentionLayer, StaticLayer

from .adapters.base import active_call
from .precision import PrecisionPolicy
from .schedule import ReplaySchedule, RollbackError

__all__ = ["ReplayHybridLayer", "ReplayLayer", "ReplayStaticHybridLayer", "RollbackError"]


class _StockView(dict):
    """``layer.recurrent_states`` / ``layer.conv_states``: ``{0: current value}``, computed when read.

    A view holds its layer's schedule, not the layer (no reference cycle: a dropped cache frees its GPU memory at
    once; ``ReplayLayer.reset`` installs new views with the new schedule), and says its kind by its class: a compiled
    step reads a view through ``layers[i]``, and each attribute it reads here is a Dynamo guard per layer, checked
    before every CUDA-graph replay (a weak reference's call was a Python guard; an instance dict adds one per method
    looked up)."""

    __slots__ = ("_schedule",)

    def __init__(self, schedule: ReplaySchedule):
        super().__init__({0: None})
        self._schedule = schedule

    def _current(self):
        raise NotImplementedError

    def __getitem__(self, state_idx):
        if state_idx != 0:
            return super().__getitem__(state_idx)
        return self._current()

    def get(self, state_idx, default=None):
        try:
            return self[state_idx]
        except KeyError:
            return default

    def __setitem__(self, state_idx, value):
        if state_idx == 0 and value is not None:
            raise RuntimeError("a ReplayLayer's state is managed by ReplayCache; it cannot be assigned")
        super().__setitem__(state_idx, value)

    def __reduce__(self):  # pickled as a plain marker; the layer rebuilds its views
        return (dict, ({},))


def _traced_positions():
    """In a compiled step, the device positions of the layer whose mixer is running, reached through the replay call
    (``call.positions``, the path the step's own reads take) rather than through the layer's schedule: one object
    reached from ``layers[i]`` two ways is an aliasing guard, which torch 2.11 checks in Python before every CUDA-graph
    replay. None outside a compiled replay call or off device positions. The layer's ``conv_states`` /
    ``recurrent_states`` properties answer from them (the mixers read only their own layer's,
    ``cache.layers[self.layer_idx]``)."""
    if not torch.compiler.is_compiling():
        return None
    call = active_call()
    if call is None:
        return None
    positions = call.positions
    return positions if positions.is_active() else None


class _ConvView(_StockView):
    __slots__ = ()

    def _current(self):
        return self._schedule.conv_window()


class _RecurrentView(_StockView):
    __slots__ = ()

    def _current(self):
        schedule = self._schedule
        inside = active_call() is not None
        if inside and schedule.device_positions.is_active():  # (maybe compiled) decode step: no host position read
            # schedule.checkpoint() gives the same tensor, but through one more call: 4-6 more Dynamo guards per step
            return schedule.device_positions.operands[0]
        if schedule.current_tokens_seen() == 0:
            return None
        return schedule.checkpoint() if inside else schedule.current_state()


def _new_schedule(recurrence, buffer_len: int, window: int, policy, layer_idx: int) -> ReplaySchedule:
    """The schedule class a recurrence names (``schedule_class``: a conv-only layer's), else ReplaySSM's own."""
    schedule_cls = getattr(recurrence, "schedule_class", ReplaySchedule)
    return schedule_cls(recurrence, buffer_len, window, policy, layer_idx)


class ReplayLayer(LinearAttentionLayer):
    """ReplaySSM state of one SSM layer (also exposes the ``LinearAttentionLayer`` attributes transformers reads)."""

    def __init__(self, buffer_len: int, window: int, policy: PrecisionPolicy | list[PrecisionPolicy],
                 layer_idx: int = 0, recurrence=None, number_of_states: int = 1, **kwargs):
        super().__init__(number_of_states=number_of_states)
        self.layer_idx = layer_idx
        self._take_schedule(_new_schedule(recurrence, buffer_len, window, policy, layer_idx))
        self.mixer_ref: weakref.ref | None = None
        self.family: str | None = None
        # Stock mixers skip their in-place single-token conv update while a layer records its past; keeping this
        # True routes every conv step through ``update_conv_state``, i.e. through the conv ring.
        self.record_past = True
        # transformers 5.25 counts a linear layer's tokens in a tensor of its own; the schedule counts ours
        self.__dict__.pop("cumulative_length_linear", None)

    def _take_schedule(self, schedule: ReplaySchedule) -> None:
        """Serve ``schedule``: ``positions`` is its device positions one attribute away (a compiled step reads them
        through the layer: each hop through the schedule is another guard per layer), the views hold it."""
        self.schedule = schedule
        self.positions = schedule.device_positions
        self._install_views()

    def _install_views(self) -> None:
        self._views = (_ConvView(self.schedule), _RecurrentView(self.schedule))

    # The stock views as properties: transformers 5.17's mixers read ``layers[i].conv_states[0]`` and
    # ``.recurrent_states[0]`` in every decode step. Read through an instance attribute, each view is a dict subclass
    # that Dynamo guards by type, length and key (three guards a view, a layer, checked before every CUDA-graph replay);
    # inside a compiled plain step the property hands the mixer a dict made in the trace instead (no guard).
    @property
    def conv_states(self) -> dict:
        positions = _traced_positions()
        if positions is not None:
            return {0: positions.conv.clone()}  # what the view gives on device positions
        return self._views[0]

    @conv_states.setter
    def conv_states(self, value) -> None:
        self._refuse_new_state("conv_states")

    @property
    def recurrent_states(self) -> dict:
        positions = _traced_positions()
        if positions is not None:
            return {0: positions.operands[0]}
        return self._views[1]

    @recurrent_states.setter
    def recurrent_states(self, value) -> None:
        self._refuse_new_state("recurrent_states")

    def _refuse_new_state(self, name: str) -> None:
        if "_views" in self.__dict__:  # transformers' __init__ assigns its own dicts before the views exist
            raise RuntimeError(f"a ReplayLayer's {name} is managed by ReplayCache; it cannot be assigned")

    def __getstate__(self):
        state = dict(self.__dict__)
        state["mixer_ref"] = None  # re-attached when the cache binds to the model again
        state.pop("_views", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._install_views()

    # ------------------------------------------------------------------ public view
    @property
    def checkpoint(self) -> torch.Tensor | None:
        """The state the recurrence continues from (float32)."""
        positions = self.positions
        if positions.is_active():  # what schedule.checkpoint() returns, with one method lookup (a guard) less
            return positions.operands[0]
        return self.schedule.checkpoint()

    def current_state(self) -> torch.Tensor | None:
        """The full recurrent state after every buffered record (materialised on demand)."""
        return self.schedule.current_state()

    @property
    def num_buffered(self) -> int:
        """Committed records not yet folded into the checkpoint."""
        return self.schedule.ring.num_committed

    @property
    def num_pending(self) -> int:
        """Speculative records a ``crop`` may still drop."""
        return self.schedule.ring.num_pending

    @property
    def buffer_len(self) -> int:
        return self.schedule.buffer_len

    @property
    def recording(self) -> bool:
        return self.schedule.recording

    @property
    def tokens_seen(self) -> int:
        return self.schedule.current_tokens_seen()

    @property
    def counters(self):
        return self.schedule.current_counters()

    @property
    def ring(self):
        return self.schedule.ring

    @property
    def conv(self):
        return self.schedule.conv

    @property
    def store(self):
        return self.schedule.store

    # ------------------------------------------------------------------ transformers layer API
    def lazy_initialization(self, *args, **kwargs) -> None:  # allocation happens on first use
        pass

    def activate_past_recording(self, **kwargs) -> None:  # kwargs: transformers 5.25's recurrent_states_to_keep
        self.schedule.activate_recording()

    def deactivate_past_recording(self) -> None:
        self.schedule.deactivate_recording()

    @property
    def is_compileable(self) -> bool:
        """A static cache's layer whose family and policy can decode on device positions."""
        return self.schedule.static and self.schedule.device_positions_supported()

    @property
    def is_croppable(self) -> bool:
        return True

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size=None, **kwargs):
        """Return ``[history, new]`` for the model's own causal conv and remember the new inputs."""
        positions = self.positions
        if positions.is_active():  # (maybe compiled) decode step: no attribute writes
            if positions.takes_conv(conv_states):  # straight to the positions: fewer guards before each graph replay
                return positions.conv_step(conv_states)
            return self.schedule.conv_update(conv_states, self.schedule.conv_kernel)
        kernel = conv_kernel_size or self.schedule.conv_kernel
        if kernel is None:
            raise ValueError("update_conv_state needs conv_kernel_size on its first call")
        full = self.schedule.conv_update(conv_states, kernel)
        self.is_conv_states_initialized[0] = True
        self.conv_kernel_size[0] = kernel
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs):
        # The replay path already updated the layer; the stock mixer only hands back what we returned.
        return recurrent_states

    def get_seq_length(self) -> int:
        return self.schedule.current_tokens_seen()

    def increase_count(self, state_idx: int = 0) -> None:
        """transformers 5.25's conv calls this only after updating a conv state in place, which a layer that records
        its past (a replay layer always does) never asks for."""
        raise RuntimeError(
            f"layer {self.layer_idx}'s conv state was updated in place, outside the ReplaySSM path (a replaced or "
            "kernelized mixer forward?); ReplayCache cannot keep it exact"
        )

    # ------------------------------------------------------------------ the replay step (called by the adapters)
    def forward_tokens(self, tokens, chunk_fn=None, out_dtype=None) -> torch.Tensor:
        positions = self.positions
        if positions.is_active():  # (maybe compiled) decode step: no attribute writes
            if positions.takes(tokens):  # straight to the positions: fewer guards before each graph replay
                return positions.step(tokens, out_dtype)
            return self.schedule.forward_tokens(tokens, chunk_fn, out_dtype)
        out = self.schedule.forward_tokens(tokens, chunk_fn, out_dtype)
        self.device = self.schedule.device
        self.is_recurrent_states_initialized[0] = True
        return out

    def prompt_part(self, count: int) -> int:
        return self.schedule.prompt_part(count)

    def finish_forward(self, count: int) -> None:
        self.schedule.finish_forward(count)
        self.has_previous_state[0] = True

    def reserve_window(self, window: int) -> None:
        self.schedule.reserve_window(window)

    def expect_prompt(self, num_tokens: int) -> None:
        self.schedule.prompt_tokens = int(num_tokens)

    # ------------------------------------------------------------------ rollback and batch ops
    def check_rollback(self, tokens_to_remove: int) -> None:
        self.schedule.check_rollback(-int(tokens_to_remove))

    def crop(self, tokens_to_remove: int) -> None:
        count = -int(tokens_to_remove)
        if count < 0:
            raise ValueError(f"ReplayLayer.crop expects a count <= 0 (tokens to drop), got {tokens_to_remove}")
        self.schedule.crop(count)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.schedule.allocated:
            self.schedule.index_batch(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.schedule.allocated:
            rows = torch.arange(self.schedule.batch_size, device=self.schedule.device)
            self.schedule.index_batch(rows.repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.schedule.allocated:
            self.schedule.index_batch(torch.as_tensor(indices, device=self.schedule.device).flatten())

    def reset(self) -> None:
        """Drop every token and the storage (the next forward may use any batch size)."""
        old = self.schedule
        self._take_schedule(_new_schedule(old.recurrence, old.buffer_len, old.window, old.store.policies,
                                          self.layer_idx))  # the views and positions follow the schedule
        self.schedule.backend = old.backend
        self.schedule.static = old.static  # (an unbound static cache resets this way: it stays static)
        self.has_previous_state[0] = False
        self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = False

    def clear_keeping_storage(self) -> None:
        """Forget every token, keeping every tensor (a static cache's reset)."""
        self.schedule.clear_keeping_storage()
        self.has_previous_state[0] = False
        self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = False

    def offload(self) -> None:  # state must stay where the layer runs
        pass

    def prefetch(self) -> None:
        pass

    def nbytes(self, exclude: set[int] = frozenset()) -> dict[str, int]:
        return self.schedule.nbytes(exclude)


class ReplayHybridLayer(ReplayLayer, DynamicLayer):
    """A layer with both an SSM state and attention K/V (falcon_h1, zamba2 hybrid blocks)."""

    def __init__(self, buffer_len: int, window: int, policy: PrecisionPolicy | list[PrecisionPolicy],
                 layer_idx: int = 0, recurrence=None, number_of_states: int = 1, **kwargs):
        DynamicLayer.__init__(self)
        ReplayLayer.__init__(self, buffer_len, window, policy, layer_idx, recurrence,
                             number_of_states=number_of_states)

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
        if self.is_initialized:
            DynamicLayer.batch_repeat_interleave(self, repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        ReplayLayer.batch_select_indices(self, indices)
        if self.is_initialized:
            DynamicLayer.batch_select_indices(self, indices)

    def reset(self) -> None:
        ReplayLayer.reset(self)
        self.keys = self.values = None
        self.is_initialized = False
        if hasattr(self, "cumulative_length"):
            self.cumulative_length = 0


def crop_static_attention(layer: StaticLayer, count: int) -> None:
    """Give back a static attention layer's newest ``-count`` slots: it writes at ``cumulative_length``, so the next
    update overwrites them (transformers 5.25's ``StaticLayer.crop`` and its sliding-window layer's own; 5.17's
    static layer has no crop). The attention part of a ``ReplayStaticHybridLayer`` (whose ``crop`` drops its SSM
    records too) through ``StaticLayer``'s."""
    if hasattr(StaticLayer, "crop"):
        (StaticLayer.crop if isinstance(layer, ReplayLayer) else type(layer).crop)(layer, count)
    else:
        layer.cumulative_length.sub_(-count)


class ReplayStaticHybridLayer(ReplayLayer, StaticLayer):
    """A layer with both an SSM state and static attention K/V (falcon_h1, zamba2 hybrid blocks in a static cache):
    the attention part is transformers' ``StaticLayer`` (preallocated to ``max_cache_len``, written at its
    ``cumulative_length``), the SSM part a ``ReplayLayer`` on device positions, so a decode step compiles."""

    def __init__(self, buffer_len: int, window: int, policy: PrecisionPolicy | list[PrecisionPolicy],
                 layer_idx: int = 0, recurrence=None, number_of_states: int = 1, max_cache_len: int | None = None,
                 **kwargs):
        if max_cache_len is None:
            raise ValueError("ReplayStaticHybridLayer needs max_cache_len (the attention slots it preallocates)")
        StaticLayer.__init__(self, max_cache_len)
        ReplayLayer.__init__(self, buffer_len, window, policy, layer_idx, recurrence,
                             number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if len(args) == 2 and not kwargs:  # attention K/V
            StaticLayer.lazy_initialization(self, *args)

    def get_seq_length(self):
        return StaticLayer.get_seq_length(self)

    def get_max_length(self) -> int:
        return StaticLayer.get_max_length(self)

    def crop(self, tokens_to_remove: int) -> None:
        ReplayLayer.crop(self, tokens_to_remove)
        if int(tokens_to_remove) and self.is_initialized:
            crop_static_attention(self, int(tokens_to_remove))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        ReplayLayer.reorder_cache(self, beam_idx)
        if self.is_initialized:
            CacheLayerMixin.reorder_cache(self, beam_idx)

    def _refuse_batch_change(self) -> None:
        if self.is_initialized:
            raise ValueError(
                f"layer {self.layer_idx}'s static attention slots hold a batch: a static ReplayCache (max_cache_len) "
                "cannot change its batch rows; use ReplayCache() without max_cache_len"
            )

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse_batch_change()
        ReplayLayer.batch_repeat_interleave(self, repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse_batch_change()
        ReplayLayer.batch_select_indices(self, indices)

    def clear_keeping_storage(self) -> None:
        """Forget every token, keeping every tensor (the static cache's reset): the attention slots are zeroed."""
        ReplayLayer.clear_keeping_storage(self)
        CacheLayerMixin.reset(self)

    def reset(self) -> None:
        ReplayLayer.reset(self)
        self.keys = self.values = None
        self.is_initialized = False
        self.cumulative_length = torch.tensor(0, dtype=torch.int64)
