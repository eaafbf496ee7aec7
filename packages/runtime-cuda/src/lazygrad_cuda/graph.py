"""`CUDAGraph`, the CUDA device's graph type (`lazygrad_uop.device.GraphRunner`): kernel launches batched into one
CUDA graph, which the JIT replays.

The graph is built once from the launches (one kernel node each, chained so that they run in order, each seeing the
writes of the ones before) and instantiated; a replay is one `cuGraphLaunch` instead of one driver call per kernel.
`update` patches the changed launches' nodes in the instantiated graph (`cuGraphExecKernelNodeSetParams`: other
buffers, values or launch sizes) without rebuilding it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cuda.bindings import driver

from lazygrad_cuda.errors import check
from lazygrad_cuda.program import CUDAProgram, KernelArgs, launch_dims
from lazygrad_uop.device import CompiledDevice, GraphError, GraphRunner, KernelLaunch

if TYPE_CHECKING:
    from lazygrad_cuda.device import CUDADevice


class CUDAGraph(GraphRunner):
    """`launches`, all of programs loaded on the GPU `device`, as one instantiated CUDA graph."""

    def __init__(self, device: CompiledDevice, launches: Sequence[KernelLaunch]) -> None:
        super().__init__(device, launches)
        for i, launch in enumerate(self.launches):
            if not isinstance(launch.program, CUDAProgram) or launch.program.device is not device:
                raise GraphError(f"launch {i} ({launch.program.name}) is not a kernel loaded on {device.device}")
        self.gpu: CUDADevice = launches[0].program.device  # type: ignore[attr-defined]
        self.gpu.activate()
        self.graph = check(driver.cuGraphCreate(0), "cuGraphCreate")
        self.nodes: list[driver.CUgraphNode] = []
        for launch in self.launches:
            params, _args = _node_params(launch)  # the driver copies the arguments while adding the node
            deps = self.nodes[-1:]
            node = check(driver.cuGraphAddKernelNode(self.graph, deps, len(deps), params), "cuGraphAddKernelNode")
            self.nodes.append(node)
        self.exec = check(driver.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        self._events: tuple[driver.CUevent, driver.CUevent] | None = None

    def update(self, changes: Mapping[int, KernelLaunch]) -> None:
        """Launch `i` becomes `changes[i]` (same program; any buffers, values, sizes) for the next replays."""
        super().update(changes)
        self.gpu.activate()
        for i in changes:
            params, _args = _node_params(self.launches[i])
            check(
                driver.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[i], params),
                "cuGraphExecKernelNodeSetParams",
            )

    def __call__(self, wait: bool = False) -> float | None:
        """Run the graph on the GPU's stream. Without `wait` return None at once; with it, block and return the
        graph's GPU time in seconds, measured with events around it."""
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
        check(driver.cuGraphLaunch(self.exec, stream), "cuGraphLaunch")
        if not wait:
            return None
        assert self._events is not None
        start, end = self._events
        check(driver.cuEventRecord(end, stream), "cuEventRecord")
        check(driver.cuEventSynchronize(end), "cuEventSynchronize")
        return float(check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e-3

    def __del__(self) -> None:
        # at interpreter exit the driver module may already be torn down; there is nothing left to free then
        try:
            if (graph_exec := getattr(self, "exec", None)) is not None:
                driver.cuGraphExecDestroy(graph_exec)
            if (graph := getattr(self, "graph", None)) is not None:
                driver.cuGraphDestroy(graph)
        except Exception:  # noqa: BLE001
            pass


def _node_params(launch: KernelLaunch) -> tuple[driver.CUDA_KERNEL_NODE_PARAMS, KernelArgs]:
    """The kernel-node parameters of `launch`, and the argument memory they point to (keep it until they are used)."""
    assert isinstance(launch.program, CUDAProgram)
    args = KernelArgs(launch.bufs, launch.vals)
    params = driver.CUDA_KERNEL_NODE_PARAMS()
    params.func = launch.program.function
    params.gridDimX, params.gridDimY, params.gridDimZ = launch_dims(launch.global_size)
    params.blockDimX, params.blockDimY, params.blockDimZ = launch_dims(launch.local_size)
    params.sharedMemBytes = 0
    params.kernelParams = args.address
    params.extra = 0
    return params, args
