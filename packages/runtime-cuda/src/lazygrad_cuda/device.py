"""An opened CUDA GPU: its primary context, the stream all its work goes on, its architecture, and the allocator,
renderer, compiler, program and graph types that run kernels on it."""

from __future__ import annotations

from cuda.bindings import driver

from lazygrad_cuda.allocator import CUDAAllocator
from lazygrad_cuda.compiler import NVRTCCompiler, compile_target
from lazygrad_cuda.errors import check
from lazygrad_cuda.graph import CUDAGraph
from lazygrad_cuda.program import CUDAProgram
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_uop.config import ContextVar
from lazygrad_uop.device import CompiledDevice, Compiler, Renderer
from lazygrad_uop.registry import DeviceName

# The GPU each lazygrad CUDA device runs on: CUDA_GPUS=0,0 opens CUDA and CUDA:1 both on GPU 0, each with its own
# stream and memory, so that several-device code runs (and is tested) on a machine with one GPU. Unset: CUDA:i is GPU i.
CUDA_GPUS = ContextVar("CUDA_GPUS", "")


def gpu_ordinal(index: int, mapping: str) -> int:
    """The GPU (driver ordinal) that lazygrad device CUDA:`index` runs on under the CUDA_GPUS value `mapping`."""
    if not mapping:
        return index
    try:
        gpus = [int(g) for g in mapping.split(",")]
    except ValueError:
        raise ValueError(f"CUDA_GPUS={mapping!r} must be GPU numbers separated by commas, like 0,0") from None
    if any(g < 0 for g in gpus):
        raise ValueError(f"CUDA_GPUS={mapping!r} holds a negative GPU number")
    if index >= len(gpus):
        raise ValueError(
            f"CUDA:{index} is not in CUDA_GPUS={mapping!r}, which places {len(gpus)} device(s); add its GPU number"
        )
    return gpus[index]


class CUDADevice(CompiledDevice):
    """Lazygrad CUDA device number `index`, opened as `name` ("CUDA", "CUDA:1"), on GPU `gpu` of the CUDA driver (the
    same number unless CUDA_GPUS places it elsewhere).

    Every operation makes the device's primary context current first, so one thread can drive several GPUs; all work
    is queued on one non-blocking stream and runs in order, asynchronously to the host until `synchronize`.
    """

    def __init__(self, name: str) -> None:
        self.index = DeviceName.parse(name).index
        self.gpu = gpu_ordinal(self.index, CUDA_GPUS.value)
        check(driver.cuInit(0), "cuInit")
        count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        if self.gpu >= count:
            names = "CUDA" if count == 1 else f"CUDA to CUDA:{count - 1}"
            where = f" (CUDA_GPUS places it on GPU {self.gpu})" if self.gpu != self.index else ""
            raise ValueError(f"there is no {name}{where}: this machine has {count} NVIDIA GPU(s) ({names})")
        self.cu_device = check(driver.cuDeviceGet(self.gpu), "cuDeviceGet")
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.cu_device), "cuDevicePrimaryCtxRetain")
        self.activate()
        major = self.attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.arch = f"sm_{major}{minor}"
        self.stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.peers: set[int] = set()
        self.multiprocessors = self.attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        # the registry hands the renderer the tensor cores registered for this architecture when it opens the device
        renderer = CUDARenderer(self.arch, compute_units=self.multiprocessors)
        compiler = NVRTCCompiler(compile_target(self.arch))
        super().__init__(name, CUDAAllocator(self), renderer, compiler, CUDAProgram, CUDAGraph)

    def attribute(self, attrib: driver.CUdevice_attribute) -> int:
        """The value of device attribute `attrib` (a `CUdevice_attribute`)."""
        return int(check(driver.cuDeviceGetAttribute(attrib, self.cu_device), f"cuDeviceGetAttribute({attrib.name})"))

    def activate(self) -> None:
        """Make this GPU's context current on the calling thread (cheap, and always done: another library, or another
        lazygrad GPU, may have changed it)."""
        check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        """Wait until all work queued on this GPU has finished."""
        self.activate()
        check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def enable_peer_access(self, other: CUDADevice) -> bool:
        """Let this GPU's kernels and copies reach `other`'s memory directly (NVLink or PCIe peer to peer), and
        `other` reach this one's. False when the hardware can't; copies between the two still work, through the
        host."""
        if other.gpu in self.peers:
            return True
        for a, b in ((self, other), (other, self)):
            if not check(driver.cuDeviceCanAccessPeer(a.cu_device, b.cu_device), "cuDeviceCanAccessPeer"):
                return False
        for a, b in ((self, other), (other, self)):
            a.activate()
            (err,) = driver.cuCtxEnablePeerAccess(b.context, 0)
            if err not in (driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
                check((err,), "cuCtxEnablePeerAccess")
        self.peers.add(other.gpu)
        other.peers.add(self.gpu)
        return True

    def use_renderer(self, renderer: Renderer, compiler: Compiler | None = None) -> None:
        """Render with `renderer` (and compile with `compiler` when given); a CUDA renderer is retargeted to this
        GPU's architecture (the registry then hands it that architecture's tensor cores)."""
        if isinstance(renderer, CUDARenderer) and renderer.arch != self.arch:
            renderer = CUDARenderer(self.arch, renderer.tensor_cores, self.multiprocessors)
        super().use_renderer(renderer, compiler)


def open_cuda(name: str) -> CUDADevice:
    """Open the CUDA device `name` ("CUDA" is GPU 0, "CUDA:1" GPU 1, ...)."""
    return CUDADevice(name)
