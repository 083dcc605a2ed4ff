"""The checkpoint of one SSM layer: the only place a replay layer reads or writes its recurrent state."""

from __future__ import annotations

import torch

from .policy import PrecisionPolicy


class CheckpointStore:
    def __init__(self, policy: PrecisionPolicy):
        self.policy = policy
        self.checkpoint: torch.Tensor | None = None

    @property
    def allocated(self) -> bool:
        return self.checkpoint is not None

    def allocate(self, shape: tuple[int, ...], device: torch.device) -> None:
        self.checkpoint = torch.zeros(shape, dtype=torch.float32, device=device)

    def read(self) -> torch.Tensor:
        """State for computing outputs on non-flush steps."""
        return self.checkpoint

    def recurrence(self) -> torch.Tensor:
        """State the recurrence continues from at a flush."""
        return self.checkpoint

    def write(self, state: torch.Tensor) -> None:
        self.checkpoint.copy_(state)

    def zero_(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint.zero_()

    def index_batch(self, index: torch.Tensor) -> None:
        if self.checkpoint is not None:
            self.checkpoint = self.checkpoint.index_select(0, index.to(self.checkpoint.device))

    def nbytes(self) -> dict[str, int]:
        size = 0 if self.checkpoint is None else self.checkpoint.numel() * self.checkpoint.element_size()
        return {"checkpoint": size, "read_copy": 0}
