"""lazygrad's CUDA device: will hold the CUDA renderer, the NVRTC compiler, the driver-API allocator and
program runner, CUDA graphs and the mma tensor-core descriptions. `plugin` registers the `CUDA` device."""
