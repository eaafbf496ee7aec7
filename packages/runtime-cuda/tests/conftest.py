"""The `gpu` fixture: a real GPU opened, or a skip saying why there is none."""

import pytest


@pytest.fixture(scope="session")
def gpu():
    """The opened CUDA device 0, or a skip saying why this machine has none."""
    from lazygrad_cuda.plugin import cuda_usable, open_cuda

    if (why := cuda_usable()) is not None:
        pytest.skip(f"needs an NVIDIA GPU: {why}")
    return open_cuda("CUDA")
