"""Learning-rate schedules with torch.optim.lr_scheduler's names and formulas.

A schedule sets its optimizer's learning rate at construction (epoch 0) and again at every `step()`. The rate lives
in the optimizer's `lr` tensor, so changing it changes no kernel (and works under TinyJit): the next optimizer step
reads the new value.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

from lazygrad.errors import InputError, KindError
from lazygrad.nn.optim import Optimizer
from lazygrad.tensor import Tensor

__all__ = [
    "CosineAnnealingLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "OneCycleLR",
    "StepLR",
]


class LRScheduler:
    """The base of every schedule: `get_lr(epoch)` says the rate for an epoch (or step) number."""

    def __init__(self, optimizer: Optimizer) -> None:
        if not isinstance(optimizer.lr, Tensor):
            raise KindError("a learning-rate schedule needs an optimizer whose lr is a tensor (the default)")
        self.optimizer = optimizer
        self.base_lr = float(optimizer.lr.item())
        self.epoch_counter = 0
        self._set(self.get_lr(0))

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr(epoch)")

    def get_last_lr(self) -> list[float]:
        """The rate set by the latest step, in a list as torch returns it (one entry per parameter group)."""
        return [self.last_lr]

    def step(self) -> None:
        """Advance one epoch (or step) and set the optimizer's rate for it."""
        self.epoch_counter += 1
        self._set(self.get_lr(self.epoch_counter))

    def _set(self, lr: float) -> None:
        self.last_lr = lr
        lr_t = self.optimizer.lr
        # realized now, not with the next step: a TinyJit replay of the step runs its kernels, not its graph
        lr_t.assign(Tensor([lr], device=lr_t.device, dtype=lr_t.dtype)).realize()


class LambdaLR(LRScheduler):
    """base_lr * lr_lambda(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float]) -> None:
        self.lr_lambda = lr_lambda
        super().__init__(optimizer)

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        return self.base_lr * self.lr_lambda(epoch)


class StepLR(LRScheduler):
    """base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """base_lr * gamma ** (number of milestones reached)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1) -> None:
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer)

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        return self.base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    """base_lr * gamma ** epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float) -> None:
        self.gamma = gamma
        super().__init__(optimizer)

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        return self.base_lr * self.gamma**epoch


class LinearLR(LRScheduler):
    """base_lr times a factor going linearly from start_factor to end_factor over total_iters epochs."""

    def __init__(
        self, optimizer: Optimizer, start_factor: float = 1 / 3, end_factor: float = 1.0, total_iters: int = 5
    ) -> None:
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer)

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        frac = min(epoch, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * frac)


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0) -> None:  # noqa: N803 - torch's name
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def get_lr(self, epoch: int) -> float:
        """The learning rate at `epoch`."""
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class OneCycleLR(LRScheduler):
    """The one-cycle policy: from max_lr / div_factor up to max_lr over pct_start of total_steps, then down to
    max_lr / (div_factor * final_div_factor), annealed by cosine or linearly. Only the learning rate cycles (torch's
    momentum cycling is not done)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float,
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
    ) -> None:
        if anneal_strategy not in ("cos", "linear"):
            raise InputError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.initial_lr = max_lr / div_factor
        self.max_lr, self.min_lr = max_lr, self.initial_lr / final_div_factor
        self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
        self.warmup_end = float(pct_start * total_steps) - 1
        super().__init__(optimizer)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
        return start + (end - start) * pct

    def get_lr(self, epoch: int) -> float:
        """The learning rate at step `epoch`."""
        if epoch > self.total_steps:
            raise InputError(f"OneCycleLR stepped {epoch} times, past its total_steps={self.total_steps}")
        if epoch <= self.warmup_end:
            return self._anneal(self.initial_lr, self.max_lr, epoch / self.warmup_end)
        end = self.total_steps - 1
        return self._anneal(self.max_lr, self.min_lr, (epoch - self.warmup_end) / (end - self.warmup_end))
