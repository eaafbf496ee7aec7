"""The `gpu` fixture: a real GPU opened, or a skip saying why there is none; `cuda_graphs`: the PYTHON device rendering
for CUDA while a test builds graphs (no GPU needed)."""

import pytest


@pytest.fixture(scope="session")
def gpu():
    """The opened CUDA device 0, or a skip saying why this machine has none."""
    from lazygrad_cuda.plugin import cuda_usable, open_cuda

    if (why := cuda_usable()) is not None:
        pytest.skip(f"needs an NVIDIA GPU: {why}")
    return open_cuda("CUDA")


@pytest.fixture
def cuda_graphs():
    """Tensor graphs built for CUDA (sm_80) without a GPU: the PYTHON device renders for CUDA while a test builds and
    schedules them (nothing runs); the renderer is yielded."""
    from lazygrad_cuda.renderer import CUDARenderer
    from lazygrad_cuda.tensor_cores import TENSOR_CORES
    from lazygrad_uop.registry import Device

    dev = Device["PYTHON"]
    before = dev.renderer
    renderer = CUDARenderer("sm_80", TENSOR_CORES["sm_80"])
    dev.use_renderer(renderer)
    yield renderer
    dev.use_renderer(before)
