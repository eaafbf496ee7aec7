"""lazygrad-scheduler: turns a lazy tensor graph into kernels (`kernelize`), orders them (`create_schedule`) and plans
the memory of the buffers they use (`plan_memory`). The tensor-graph facts it builds on (`is_leaf`, `buffer_of`,
`view_base`, ...) live in `lazygrad_uop.tensor_graph`."""

from lazygrad_scheduler.kernelize import Kernel, kernelize
from lazygrad_scheduler.memory import intermediate_buffers, plan_memory, planned_bytes
from lazygrad_scheduler.schedule import ScheduleError, ScheduleItem, create_schedule

__version__ = "0.8.0"

__all__ = [
    "Kernel",
    "ScheduleError",
    "ScheduleItem",
    "create_schedule",
    "intermediate_buffers",
    "kernelize",
    "plan_memory",
    "planned_bytes",
]
