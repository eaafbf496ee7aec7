"""Which devices' buffers a kernel may read where they lie.

A COPY between two devices whose memory is the host's (CPU:0 and CPU:1: their allocators say `shares_host_memory`)
needs no bytes moved before a kernel can read the value: the kernel on the target device takes the source buffer's
address like any of its own. The scheduler then fuses such a copy into the kernels that read it (an in-place read)
instead of giving it a copy of its own; a copy that is itself an output gets its own buffer, written by a kernel that
reads the source in place.
"""

from __future__ import annotations

from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import shares_host_memory
from lazygrad_uop.shape import device_of
from lazygrad_uop.uop import UOp


def reads_in_place(copy: UOp) -> bool:
    """Whether COPY node `copy` can be a read of its source's buffer by the kernels on its target device."""
    src = device_of(copy.src[1])
    return copy.op is Ops.COPY and isinstance(src, str) and shares_host_memory(copy.src[0].arg, src)
