"""`GlobalCounters`: what the engine has run since the last reset (kernels, ALU operations, bytes moved, time).

The engine adds to it for every kernel and copy it runs, JIT replays included, so a training loop can print its own
throughput as tinygrad programs do:

    GlobalCounters.reset()
    step()
    print(GlobalCounters.kernel_count, GlobalCounters.global_ops / GlobalCounters.time_sum_s)
"""

from __future__ import annotations

from typing import ClassVar

from lazygrad_uop.device import MemoryUse


class _WithMemoryUse(type):
    @property
    def mem_used(cls) -> int:
        """Bytes of device memory that buffers hold now, on all devices (`lazygrad_uop.device.MemoryUse`)."""
        return sum(MemoryUse.used.values())


class GlobalCounters(metaclass=_WithMemoryUse):
    """Process-wide totals since the last `reset()`. `time_sum_s` adds the kernels' own run times, which the engine
    measures only when it waits for each kernel (DEBUG>=2, or a caller that asks it to wait): waiting costs time.
    `GlobalCounters.mem_used` is the device memory held now (not reset)."""

    kernel_count: ClassVar[int] = 0
    global_ops: ClassVar[int] = 0
    global_mem: ClassVar[int] = 0
    time_sum_s: ClassVar[float] = 0.0

    @staticmethod
    def reset() -> None:
        """Set every counter back to zero."""
        GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0
        GlobalCounters.time_sum_s = 0.0

    @staticmethod
    def add(kernels: int, ops: int, mem: int, seconds: float | None) -> None:
        """Count `kernels` runs that did `ops` operations and moved `mem` bytes in `seconds` (None: not timed)."""
        GlobalCounters.kernel_count += kernels
        GlobalCounters.global_ops += ops
        GlobalCounters.global_mem += mem
        if seconds is not None:
            GlobalCounters.time_sum_s += seconds
