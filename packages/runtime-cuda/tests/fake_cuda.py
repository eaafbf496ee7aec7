"""A stand-in for the CUDA driver, so the runtime's driver-API calls run without a GPU.

Each call is first handed to the real `cuda.bindings.driver` function, which converts and checks every argument
before it loads the driver library; on a machine without one, a call whose arguments it accepts ends with
"driver library not found". Only then does the stand-in answer, with values of the types the real call returns, and
with "device memory" that is host memory, so copies move real bytes.

`cuTensorMapEncodeTiled` answers with a map whose 128 bytes are `stand_in_tensor_map` of its arguments.

Kernels run where a test registers a host implementation for their name (`FakeDriver.kernels`): a launch runs it at
once (the stand-in's stream is synchronous), and a graph keeps each kernel node's arguments as the driver does
(copied when the node is added; the executable graph gets its own copy when instantiated, which
`cuGraphExecKernelNodeSetParams` patches) and runs the nodes on `cuGraphLaunch` in an order their dependencies allow
but that is otherwise the reverse of how they were added, so a graph missing a dependency computes the wrong thing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from cuda.bindings import driver as real_driver
from cuda.pathfinder import DynamicLibNotFoundError

from lazygrad_cuda import allocator, device, errors, graph, program

OK = real_driver.CUresult.CUDA_SUCCESS
# shared memory any kernel may use without opting in
STATIC_SHARED = 48 * 1024

# A host implementation of a kernel: (grid, block, buffer addresses, int values) -> None.
HostKernel = Callable[[tuple[int, int, int], tuple[int, int, int], list[int], list[int]], None]


def driver_missing() -> bool:
    """True where no CUDA driver library loads (the stand-in must not be used where one does)."""
    try:
        real_driver.cuInit(0)
    except DynamicLibNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - any other failure means a driver library is there
        return False
    return False


def stand_in_tensor_map(address: int, dtype: int, dims: list[int], strides: list[int], box: list[int]) -> bytes:
    """The 128 bytes of the stand-in's tensor maps: 16 little-endian words, the address, the data type, dims (5
    words), strides (4) and box (5), each padded with zeros."""

    def pad(xs: list[int], n: int) -> list[int]:
        return [*xs, *[0] * (n - len(xs))]

    words = [address, dtype, *pad(dims, 5), *pad(strides, 4), *pad(box, 5)]
    return b"".join(w.to_bytes(8, "little") for w in words)


@dataclass
class FakeKernel:
    """The parameters a kernel takes (`nbufs` 64-bit addresses, then `nvals` 32-bit ints, then `nmaps` 128-byte
    tensor maps) and how it runs."""

    nbufs: int
    nvals: int
    run: HostKernel | None = None
    nmaps: int = 0


@dataclass
class Node:
    """A kernel node as the stand-in keeps it: its dependencies and the arguments copied from its parameters."""

    deps: list[int]
    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    bufs: list[int]
    vals: list[int]
    shared: int = 0


@dataclass
class Graphs:
    """Graphs (node id -> node, in order of creation) and executable graphs (their own copies)."""

    graphs: dict[int, dict[int, Node]] = field(default_factory=dict)
    execs: dict[int, dict[int, Node]] = field(default_factory=dict)


class FakeDriver:
    """`cuda.bindings.driver` with every `cu*` function checked by the real one and answered from `answers`.

    `param_shape` is (buffers, ints) and `param_maps` the tensor maps of kernels with no entry in `kernels`: launches
    and graph nodes record their decoded arguments in `kernel_args`, and the bytes of their tensor maps in
    `kernel_maps`, while the argument memory is alive. `fail[name] = CUresult` makes the next call of `name` fail
    with it.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.memory: dict[int, ctypes.Array] = {}
        self.handles = iter(range(0x1000, 0x100000))
        self.fail: dict[str, Any] = {}
        self.param_shape = (0, 0)
        self.kernel_args: list[tuple[list[int], list[int]]] = []
        self.param_maps = 0
        self.kernel_maps: list[list[bytes]] = []
        self.kernels: dict[str, FakeKernel] = {}
        self.function_names: dict[int, str] = {}
        self.launched: list[str] = []  # names of the kernels run, in order
        # function -> the dynamic shared memory it was opted in to (cuFuncSetAttribute); a launch with more than
        # STATIC_SHARED bytes without it fails, as the driver's does
        self.max_dynamic_shared: dict[int, int] = {}
        self.g = Graphs()
        self._checking = False
        d = real_driver
        nothing: Callable[..., tuple] = lambda *args: ()  # noqa: E731
        self.answers: dict[str, Callable[..., tuple]] = {
            "cuInit": nothing,
            "cuDeviceGetCount": lambda: (2,),
            "cuDeviceGet": lambda ordinal: (d.CUdevice(ordinal),),
            "cuDevicePrimaryCtxRetain": lambda dev: (d.CUcontext(0x100 + int(dev)),),
            "cuDeviceGetAttribute": lambda attrib, dev: (
                8 if attrib == d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR else 6,
            ),
            "cuDeviceCanAccessPeer": lambda a, b: (1,),
            "cuStreamCreate": lambda flags: (d.CUstream(next(self.handles)),),
            "cuEventCreate": lambda flags: (d.CUevent(next(self.handles)),),
            "cuEventElapsedTime": lambda start, end: (1.5,),
            "cuMemAlloc": lambda size: (d.CUdeviceptr(self._alloc(size)),),
            "cuMemHostAlloc": lambda size, flags: (self._alloc(size),),
            "cuMemFree": self._free,
            "cuMemFreeHost": self._free,
            "cuMemcpyHtoDAsync": lambda dst, src, n, stream: self._copy(dst, src, n),
            "cuMemcpyDtoHAsync": lambda dst, src, n, stream: self._copy(dst, src, n),
            "cuMemcpyDtoDAsync": lambda dst, src, n, stream: self._copy(dst, src, n),
            "cuMemcpyPeerAsync": lambda dst, dctx, src, sctx, n, stream: self._copy(dst, src, n),
            "cuModuleLoadData": lambda image: (d.CUmodule(next(self.handles)),),
            "cuFuncSetAttribute": self._set_attribute,
            "cuModuleGetFunction": self._get_function,
            "cuLaunchKernel": self._launch,
            "cuGraphCreate": self._graph_create,
            "cuGraphAddKernelNode": self._add_node,
            "cuGraphInstantiate": self._instantiate,
            "cuGraphExecKernelNodeSetParams": self._set_params,
            "cuGraphLaunch": self._graph_launch,
            "cuGetErrorString": lambda err: (b"described by the stand-in driver",),
            "cuTensorMapEncodeTiled": self._encode_tensor_map,
        }
        for name in (
            "cuCtxSetCurrent cuCtxEnablePeerAccess cuEventRecord cuEventSynchronize cuEventDestroy cuStreamSynchronize "
            "cuStreamWaitEvent cuModuleUnload cuGraphExecDestroy cuGraphDestroy"
        ).split():
            self.answers[name] = nothing

    def __getattr__(self, name: str) -> Any:
        real = getattr(real_driver, name)
        if not (name.startswith("cu") and callable(real)) or isinstance(real, type):  # types (cuuint64_t) as they are
            return real
        answer = self.answers[name]

        def call(*args: Any) -> tuple:
            # A garbage-collected graph or program may call the driver from its __del__ while the real function is
            # looking for the driver library, under that lookup's lock: such a nested call skips the real check.
            if not self._checking:
                self._checking = True
                try:
                    real(*args)
                except DynamicLibNotFoundError:
                    pass  # the arguments were accepted; only the library was missing
                finally:
                    self._checking = False
            self.calls.append((name, args))
            if (err := self.fail.pop(name, None)) is not None:
                return (err, None)
            answered = answer(*args)
            # an answer that starts with a status is a failure the stand-in itself reports (a refused launch)
            if answered and isinstance(answered[0], real_driver.CUresult):
                return answered
            return (OK, *answered)

        return call

    def names(self) -> list[str]:
        """The names of the calls made, in order."""
        return [name for name, _ in self.calls]

    def args_of(self, name: str) -> list[tuple]:
        """The arguments of every call of `name`, in order."""
        return [args for n, args in self.calls if n == name]

    def _alloc(self, size: int) -> int:
        mem = (ctypes.c_char * size)()
        self.memory[ctypes.addressof(mem)] = mem
        return ctypes.addressof(mem)

    def _free(self, ptr: Any) -> tuple:
        del self.memory[int(ptr)]
        return ()

    def _copy(self, dst: Any, src: Any, n: int) -> tuple:
        ctypes.memmove(int(dst), int(src), n)
        return ()

    def _set_attribute(self, function: Any, attribute: Any, value: int) -> tuple:
        if attribute == real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            self.max_dynamic_shared[int(function)] = int(value)
        return ()

    def _shared_refused(self, function: Any, shared: int) -> bool:
        """Whether the driver would refuse a launch of `function` with `shared` bytes of dynamic shared memory."""
        return shared > max(STATIC_SHARED, self.max_dynamic_shared.get(int(function), 0))

    def _get_function(self, module: Any, name: bytes) -> tuple:
        function = real_driver.CUfunction(next(self.handles))
        self.function_names[int(function)] = name.decode()
        return (function,)

    def _decode(self, function: Any, address: int) -> tuple[list[int], list[int]]:
        """The arguments behind a `void**` kernel-parameter array, recorded in `kernel_args`."""
        kernel = self.kernels.get(self.function_names.get(int(function), ""))
        nbufs, nvals = (kernel.nbufs, kernel.nvals) if kernel is not None else self.param_shape
        nmaps = kernel.nmaps if kernel is not None else self.param_maps
        ptrs = (ctypes.c_void_p * max(nbufs + nvals + nmaps, 1)).from_address(address)
        bufs = [ctypes.c_uint64.from_address(ptrs[i]).value for i in range(nbufs)]
        vals = [ctypes.c_int32.from_address(ptrs[nbufs + i]).value for i in range(nvals)]
        self.kernel_args.append((bufs, vals))
        self.kernel_maps.append([ctypes.string_at(ptrs[nbufs + nvals + i], 128) for i in range(nmaps)])
        return bufs, vals

    def _encode_tensor_map(self, dtype, rank, address, dims, strides, box, *modes: Any) -> tuple:
        tensor_map = real_driver.CUtensorMap()
        words = stand_in_tensor_map(int(address), int(dtype), *([int(x) for x in xs] for xs in (dims, strides, box)))
        tensor_map.opaque = [int.from_bytes(words[i : i + 8], "little") for i in range(0, 128, 8)]
        return (tensor_map,)

    def _run(self, function: int, grid: tuple[int, int, int], block: tuple[int, int, int], bufs, vals) -> None:
        name = self.function_names.get(function, "")
        self.launched.append(name)
        if (kernel := self.kernels.get(name)) is not None and kernel.run is not None:
            kernel.run(grid, block, bufs, vals)

    def _launch(self, function: Any, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> tuple:
        if self._shared_refused(function, shared):
            return (real_driver.CUresult.CUDA_ERROR_INVALID_VALUE,)
        bufs, vals = self._decode(function, params)
        self._run(int(function), (gx, gy, gz), (bx, by, bz), bufs, vals)
        return ()

    def _node(self, deps: list[Any], params: Any) -> Node:
        bufs, vals = self._decode(params.func, params.kernelParams)
        grid = (params.gridDimX, params.gridDimY, params.gridDimZ)
        block = (params.blockDimX, params.blockDimY, params.blockDimZ)
        return Node([int(x) for x in deps], int(params.func), grid, block, bufs, vals, int(params.sharedMemBytes))

    def _graph_create(self, flags: int) -> tuple:
        graph_ = real_driver.CUgraph(next(self.handles))
        self.g.graphs[int(graph_)] = {}
        return (graph_,)

    def _add_node(self, graph_: Any, deps: list, n: int, params: Any) -> tuple:
        nodes = self.g.graphs[int(graph_)]
        assert n == len(deps) and all(int(x) in nodes for x in deps), "a dependency that is not a node of the graph"
        if self._shared_refused(params.func, params.sharedMemBytes):
            return (real_driver.CUresult.CUDA_ERROR_INVALID_VALUE, None)
        node = real_driver.CUgraphNode(next(self.handles))
        nodes[int(node)] = self._node(deps, params)
        return (node,)

    def _instantiate(self, graph_: Any, flags: int) -> tuple:
        graph_exec = real_driver.CUgraphExec(next(self.handles))
        nodes = self.g.graphs[int(graph_)]
        self.g.execs[int(graph_exec)] = {k: Node(**vars(v)) for k, v in nodes.items()}
        return (graph_exec,)

    def _set_params(self, graph_exec: Any, node: Any, params: Any) -> tuple:
        nodes = self.g.execs[int(graph_exec)]
        old = nodes[int(node)]
        nodes[int(node)] = self._node(old.deps, params)
        return ()

    def _graph_launch(self, graph_exec: Any, stream: Any) -> tuple:
        nodes = self.g.execs[int(graph_exec)]
        done: set[int] = set()
        while len(done) < len(nodes):
            # of the nodes whose dependencies have run, the one added last
            ready = [k for k, v in nodes.items() if k not in done and all(d in done for d in v.deps)]
            k = ready[-1]
            v = nodes[k]
            self._run(v.function, v.grid, v.block, v.bufs, v.vals)
            done.add(k)
        return ()


def install(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """Route the runtime's driver calls to a new stand-in (a fixture should `gc.collect()` before the monkeypatch
    is undone, so that the objects of its test free their handles on this stand-in)."""
    stand_in = FakeDriver()
    for module in (allocator, device, errors, graph, program):
        monkeypatch.setattr(module, "driver", stand_in)
    return stand_in
