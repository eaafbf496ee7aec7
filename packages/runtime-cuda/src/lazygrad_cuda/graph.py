"""`CUDAGraph`, the CUDA device's graph type (`lazygrad_uop.device.GraphRunner`): kernel launches batched into one
CUDA graph, which the JIT replays.

The graph is built once from the launches (one kernel node each, each depending on the one before, so that they run
in order and each sees the writes of the ones before) and instantiated; a replay is one `cuGraphLaunch` on the
device's stream instead of one driver call per kernel. `update` patches the changed launches' nodes in the
instantiated graph (`cuGraphExecKernelNodeSetParams`: other buffers, values or launch sizes) without rebuilding it;
the driver applies a patch to the launches that follow it only, so a replay still queued keeps its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cuda.bindings import driver

from lazygrad_cuda.allocator import CUDABuffer
from lazygrad_cuda.errors import CUDAError, check
from lazygrad_cuda.program import CUDAProgram, KernelArgs, launch_dims
from lazygrad_uop.device import CompiledDevice, GraphError, GraphRunner, KernelLaunch

if TYPE_CHECKING:
    from lazygrad_cuda.device import CUDADevice


class CUDAGraph(GraphRunner):
    """`launches`, all of programs loaded on the GPU `device`, as one instantiated CUDA graph.

    Raises GraphError for launches it can't batch (programs or buffers of another device, launch sizes the driver
    would refuse) and when the driver can't build or instantiate the graph: the JIT then runs the kernels one by
    one. Driver errors while updating or launching an instantiated graph are real failures and raise CUDAError.
    """

    def __init__(self, device: CompiledDevice, launches: Sequence[KernelLaunch]) -> None:
        super().__init__(device, launches)
        for i, launch in enumerate(self.launches):
            _check_launch(device, i, launch)
        self.gpu: CUDADevice = device  # type: ignore[assignment]
        self.gpu.activate()
        self._events: tuple[driver.CUevent, driver.CUevent] | None = None
        self.nodes: list[driver.CUgraphNode] = []
        try:
            self.graph = check(driver.cuGraphCreate(0), "cuGraphCreate")
            for launch in self.launches:
                params, _args = _node_params(launch)  # the driver copies the arguments while adding the node
                deps = self.nodes[-1:]
                node = check(
                    driver.cuGraphAddKernelNode(self.graph, deps, len(deps), params),
                    f"cuGraphAddKernelNode({launch.program.name})",
                )
                self.nodes.append(node)
            self.exec = check(driver.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        except CUDAError as exc:
            self._destroy()
            raise GraphError(
                f"the CUDA driver could not build a graph of {len(self.launches)} kernels on {device.device}: {exc}"
            ) from exc

    def update(self, changes: Mapping[int, KernelLaunch]) -> None:
        """Launch `i` becomes `changes[i]` (same program; any buffers, values, sizes) for the next replays."""
        for i, launch in changes.items():
            _check_launch(self.device, i, launch)
        super().update(changes)
        self.gpu.activate()
        for i in changes:
            params, _args = _node_params(self.launches[i])
            check(
                driver.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[i], params),
                f"cuGraphExecKernelNodeSetParams(launch {i}, {self.launches[i].program.name})",
            )

    def __call__(self, wait: bool = False) -> float | None:
        """Run the graph on the GPU's stream, after the work queued there before. Without `wait` return None at
        once; with it, block and return the graph's GPU time in seconds, measured with events around it."""
        self.gpu.activate()
        stream = self.gpu.stream
        if wait:
            if self._events is None:
                flags = driver.CUevent_flags.CU_EVENT_DEFAULT
                self._events = (
                    check(driver.cuEventCreate(flags), "cuEventCreate"),
                    check(driver.cuEventCreate(flags), "cuEventCreate"),
                )
            check(driver.cuEventRecord(self._events[0], stream), "cuEventRecord")
        check(driver.cuGraphLaunch(self.exec, stream), f"cuGraphLaunch ({len(self.launches)} kernels)")
        if not wait:
            return None
        assert self._events is not None
        start, end = self._events
        check(driver.cuEventRecord(end, stream), "cuEventRecord")
        check(driver.cuEventSynchronize(end), "cuEventSynchronize")
        return float(check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e-3

    def _destroy(self) -> None:
        # The driver frees an executable graph that is still running once it finishes.
        if (graph_exec := getattr(self, "exec", None)) is not None:
            driver.cuGraphExecDestroy(graph_exec)
        if (graph := getattr(self, "graph", None)) is not None:
            driver.cuGraphDestroy(graph)
        for event in getattr(self, "_events", None) or ():
            driver.cuEventDestroy(event)
        self.exec = self.graph = self._events = None

    def __del__(self) -> None:
        # at interpreter exit the driver module may already be torn down; there is nothing left to free then
        try:
            self._destroy()
        except Exception:  # noqa: BLE001
            pass


def _check_launch(device: CompiledDevice, i: int, launch: KernelLaunch) -> None:
    """Raise GraphError unless `launch` is a kernel loaded on `device`, on its buffers, with valid launch sizes."""
    if not isinstance(launch.program, CUDAProgram) or launch.program.device is not device:
        raise GraphError(f"launch {i} ({launch.program.name}) is not a kernel loaded on {device.device}")
    for j, b in enumerate(launch.bufs):
        if not isinstance(b, CUDABuffer):
            raise GraphError(
                f"buffer {j} of launch {i} ({launch.program.name}) is a {type(b).__name__}, not memory of a CUDA "
                "allocator"
            )
    try:
        for size in (launch.global_size, launch.local_size):
            launch_dims(size)
    except ValueError as exc:
        raise GraphError(f"launch {i} ({launch.program.name}): {exc}") from exc


def _node_params(launch: KernelLaunch) -> tuple[driver.CUDA_KERNEL_NODE_PARAMS, KernelArgs]:
    """The kernel-node parameters of `launch`, and the argument memory they point to (keep it until they are used):
    its tensor maps are encoded over this launch's buffers, so a node whose buffers change gets maps of the new ones."""
    assert isinstance(launch.program, CUDAProgram)
    args = KernelArgs(launch.bufs, launch.vals, launch.program.tensor_maps, launch.program.name)
    params = driver.CUDA_KERNEL_NODE_PARAMS()
    params.func = launch.program.function
    params.gridDimX, params.gridDimY, params.gridDimZ = launch_dims(launch.global_size)
    params.blockDimX, params.blockDimY, params.blockDimZ = launch_dims(launch.local_size)
    params.sharedMemBytes = launch.program.dynamic_shared
    params.kernelParams = args.address
    params.extra = 0
    return params, args
