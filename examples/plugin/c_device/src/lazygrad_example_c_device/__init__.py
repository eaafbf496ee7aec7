"""An example lazygrad device: host memory, kernels in C compiled by the system C compiler, run through ctypes."""
