"""lazygrad-scheduler: turns a lazy tensor graph into kernels (`kernelize`) and orders them (`create_schedule`)."""

from lazygrad_scheduler.buffers import attach_buffer, buffer_of, new_buffer
from lazygrad_scheduler.kernelize import Kernel, is_kernelized, is_leaf, is_view_of_leaf, kernelize
from lazygrad_scheduler.schedule import ScheduleError, ScheduleItem, create_schedule

__version__ = "0.3.0"

__all__ = [
    "Kernel",
    "ScheduleError",
    "ScheduleItem",
    "attach_buffer",
    "buffer_of",
    "create_schedule",
    "is_kernelized",
    "is_leaf",
    "is_view_of_leaf",
    "kernelize",
    "new_buffer",
]
