"""The `GraphRunner` contract (`lazygrad_uop.device`), as checks that any device's graph type must pass, written once
for every implementation: give `CHECKS` a `GraphHarness` for a device (real, or a stand-in whose kernels run on the
host) and each check builds graphs of that device's type and compares what they compute with numpy.

Every check runs one kernel, "add": `data0[i] = data1[i] + data2[i] + k` for `i = gidx0 * block + lidx0` over the
launch's `global_size[0]` blocks of `block` threads, with `k` its one variable. `add_kernel_uops` is its linear
program, for devices that render and compile it; `host_add` is the same kernel for stand-ins to run on host memory.
Values are small integers held in float32, so every result is exact. The kernel's index doesn't depend on the size
its SPECIALs declare, so a launch may cover fewer blocks, as a kernel whose global size is symbolic does.

`harness_for(device)` builds a harness for any device opened through the registry, rendering and compiling the
kernel with the device's own renderer and compiler; device packages with stand-in drivers build their own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from lazygrad_uop.device import CompiledDevice, GraphError, GraphRunner, KernelLaunch, Program
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

# blocks of the arrays the checks use; a harness's kernel must cover up to this many blocks
BLOCKS = 8


def host_add(grid: tuple[int, int, int], block: tuple[int, int, int], addrs: list[int], vals: list[int]) -> None:
    """The "add" kernel on host memory: float32 arrays at `addrs` (out, a, b), `vals` = (k,)."""
    n = grid[0] * block[0]
    out, a, b = (np.ctypeslib.as_array((ctypes.c_float * n).from_address(p)) for p in addrs)
    out[:] = a + b + np.float32(vals[0])


def add_kernel_uops(name: str, block: int, blocks: int = BLOCKS, host_threads: bool = False) -> list[UOp]:
    """The linear program of the "add" kernel named `name`, for `blocks` blocks of `block` threads. With
    `host_threads` (a host target such as the CPU, block 1) the index is `SPECIAL core0`, the axis such a target
    splits across its cores."""
    n = block * blocks
    out, a, b = (UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(n), arg=slot) for slot in range(3))
    k = UOp.variable("k", -(2**20), 2**20)
    if host_threads:
        assert block == 1, "a host target's launches have one thread per block"
        i = UOp(Ops.SPECIAL, dtypes.int32, arg=("core0", blocks))
    else:
        gidx, lidx = (UOp(Ops.SPECIAL, dtypes.int32, arg=arg) for arg in (("gidx0", blocks), ("lidx0", block)))
        i = gidx * block + lidx

    def load(buf: UOp) -> UOp:
        return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, buf.dtype, (buf, i)),))

    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i)), load(a) + load(b) + k.cast(dtypes.float32)))
    order: list[UOp] = [out, a, b, k]

    def place(u: UOp) -> None:
        if u not in order:
            for s in u.src:
                place(s)
            order.append(u)

    place(st)
    return [*order, UOp(Ops.SINK, dtypes.void, arg=name)]


@dataclass
class GraphHarness:
    """What the checks need of a device: the opened `device` (whose `graph` type they test), the threads per block
    of its "add" kernels, and functions that make an "add" program named `name`, copy a float32 array to a new
    buffer and back (`download(handle, n)`; it waits for the device), and make a program the graph must refuse
    (e.g. one of another device)."""

    device: CompiledDevice
    block: int
    program: Callable[[str], Program]
    upload: Callable[[np.ndarray], Any]
    download: Callable[[Any, int], np.ndarray]
    foreign: Callable[[], Program]

    @property
    def n(self) -> int:
        """Elements of the arrays the checks use."""
        return self.block * BLOCKS

    def graph(self, launches: list[KernelLaunch]) -> GraphRunner:
        """A graph of the device's graph type."""
        assert self.device.graph is not None, f"{self.device.device} has no graph type"
        return self.device.graph(self.device, launches)

    def add(self, prog: Program, out: Any, a: Any, b: Any, k: int, blocks: int = BLOCKS) -> KernelLaunch:
        """A launch of "add": out = a + b + k over the first `blocks` blocks."""
        return KernelLaunch(prog, (out, a, b), (blocks, 1, 1), (self.block, 1, 1), (k,))

    def array(self, seed: int) -> np.ndarray:
        """Small integers as float32, so sums are exact."""
        return np.random.default_rng(seed).integers(-50, 50, self.n).astype(np.float32)

    def zeros(self) -> Any:
        return self.upload(np.zeros(self.n, np.float32))


def check_launches_run_in_order_and_wait_times_them(h: GraphHarness) -> None:
    """Each launch sees the writes of the ones before; two programs in one graph; `wait` returns seconds."""
    x, y = h.array(1), h.array(2)
    bx, by, t1, t2, out = h.upload(x), h.upload(y), h.zeros(), h.zeros(), h.zeros()
    p, q = h.program("lg_contract_p"), h.program("lg_contract_q")
    g = h.graph([h.add(p, t1, bx, by, 1), h.add(q, t2, t1, bx, 2), h.add(p, out, t2, t1, 3)])
    seconds = g(wait=True)
    assert isinstance(seconds, float) and 0 <= seconds < 60, f"a graph run with wait returns seconds, got {seconds!r}"
    r1 = x + y + 1
    r2 = r1 + x + 2
    np.testing.assert_array_equal(h.download(t1, h.n), r1)
    np.testing.assert_array_equal(h.download(t2, h.n), r2)
    np.testing.assert_array_equal(h.download(out, h.n), r2 + r1 + 3)


def check_every_replay_runs_every_launch_once(h: GraphHarness) -> None:
    """Launches that update a buffer in place: each replay, waited for or not, applies each of them once."""
    x, y = h.array(3), h.array(4)
    acc, by = h.upload(x), h.upload(y)
    p = h.program("lg_contract_p")
    g = h.graph([h.add(p, acc, acc, by, 1), h.add(p, acc, acc, by, 2)])
    assert g() is None, "a graph run without wait returns None"
    assert g() is None
    np.testing.assert_array_equal(h.download(acc, h.n), x + 2 * (2 * y + 3))
    g(wait=True)
    np.testing.assert_array_equal(h.download(acc, h.n), x + 3 * (2 * y + 3))


def check_update_swaps_buffers_and_values(h: GraphHarness) -> None:
    """`update` changes only the launches it names, for every later replay; launches keep earlier updates."""
    x, y, x2 = h.array(5), h.array(6), h.array(7)
    bx, by, bx2, t, out = h.upload(x), h.upload(y), h.upload(x2), h.zeros(), h.zeros()
    p, q = h.program("lg_contract_p"), h.program("lg_contract_q")
    g = h.graph([h.add(p, t, bx, by, 1), h.add(q, out, t, by, 2)])
    g(wait=True)
    np.testing.assert_array_equal(h.download(out, h.n), x + 2 * y + 3)
    g.update({0: h.add(p, t, bx2, by, 1)})
    g()
    np.testing.assert_array_equal(h.download(out, h.n), x2 + 2 * y + 3)
    g.update({1: h.add(q, out, t, bx2, -7)})
    g()
    g()
    np.testing.assert_array_equal(h.download(out, h.n), 2 * x2 + y + 1 - 7)
    g.update({})
    g(wait=True)
    np.testing.assert_array_equal(h.download(out, h.n), 2 * x2 + y + 1 - 7)


def check_update_changes_launch_sizes(h: GraphHarness) -> None:
    """An update may change a launch's global size (its variables changed): the next replays cover that many."""
    x, y = h.array(8), h.array(9)
    bx, by, out = h.upload(x), h.upload(y), h.zeros()
    p = h.program("lg_contract_p")
    g = h.graph([h.add(p, out, bx, by, 4)])
    g(wait=True)
    fresh = h.upload(np.full(h.n, -1000, np.float32))
    half = BLOCKS // 2
    g.update({0: h.add(p, fresh, bx, by, 5, blocks=half)})
    g(wait=True)
    got, cut = h.download(fresh, h.n), half * h.block
    np.testing.assert_array_equal(got[:cut], (x + y + 5)[:cut])
    np.testing.assert_array_equal(got[cut:], np.full(h.n - cut, -1000, np.float32))


def check_update_leaves_a_queued_replay_alone(h: GraphHarness) -> None:
    """A replay queued without wait computes with the launches it was queued with, whatever updates follow."""
    x, y, x2 = h.array(10), h.array(11), h.array(12)
    bx, by, bx2 = h.upload(x), h.upload(y), h.upload(x2)
    t, out, t_b, out_b = h.zeros(), h.zeros(), h.zeros(), h.zeros()
    p = h.program("lg_contract_p")
    g = h.graph([h.add(p, t, bx, by, 0), h.add(p, out, t, by, 0)])
    g()
    g.update({0: h.add(p, t_b, bx2, by, 0), 1: h.add(p, out_b, t_b, by, 0)})
    g()
    np.testing.assert_array_equal(h.download(out, h.n), x + 2 * y)
    np.testing.assert_array_equal(h.download(out_b, h.n), x2 + 2 * y)


def check_refusals_are_graph_errors(h: GraphHarness) -> None:
    """What a graph can't take raises GraphError: no launches, a program it can't run, an update that changes a
    launch's program or argument counts."""
    bx, out = h.upload(h.array(13)), h.zeros()
    p, q = h.program("lg_contract_p"), h.program("lg_contract_q")
    with pytest.raises(GraphError):
        h.graph([])
    with pytest.raises(GraphError):
        h.graph([h.add(p, out, bx, bx, 0), h.add(h.foreign(), out, bx, bx, 0)])
    g = h.graph([h.add(p, out, bx, bx, 1)])
    with pytest.raises(GraphError):
        g.update({0: h.add(q, out, bx, bx, 1)})
    with pytest.raises(GraphError):
        g.update({0: KernelLaunch(p, (out, bx), (BLOCKS, 1, 1), (h.block, 1, 1), (1,))})
    g(wait=True)
    np.testing.assert_array_equal(h.download(out, h.n), 2 * h.array(13) + 1)


CHECKS: list[Callable[[GraphHarness], None]] = [
    check_launches_run_in_order_and_wait_times_them,
    check_every_replay_runs_every_launch_once,
    check_update_swaps_buffers_and_values,
    check_update_changes_launch_sizes,
    check_update_leaves_a_queued_replay_alone,
    check_refusals_are_graph_errors,
]


def check_jit_replays_through_the_graph(device: str) -> None:
    """A jitted function of three kernels on `device`, called with new inputs, matches numpy on every call, and its
    replays run as one graph of the device's graph type."""
    lazygrad = pytest.importorskip("lazygrad", reason="the JIT is part of the lazygrad frontend")
    from lazygrad.jit import _GraphStep

    @lazygrad.TinyJit
    def f(a: Any, b: Any) -> Any:
        x = (a + b).contiguous()
        y = (x * a - 1).contiguous()
        return (y * 2 + x).sum(axis=1)

    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = (rng.integers(-8, 8, (16, 32)).astype(np.float32) for _ in range(2))
        got = f(lazygrad.Tensor(a, device=device), lazygrad.Tensor(b, device=device)).numpy()
        x = a + b
        np.testing.assert_array_equal(got, ((x * a - 1) * 2 + x).sum(axis=1))
    assert f.captured is not None and len(f.jit_cache) == 3, f"expected 3 kernels, captured {len(f.jit_cache)}"
    (step,) = f.captured.steps
    graph_type = lazygrad.Device[device].graph
    assert isinstance(step, _GraphStep) and type(step.graph) is graph_type


def harness_for(name: str) -> GraphHarness:
    """A harness for the device `name`, opened through the registry: the "add" kernel rendered by its renderer
    (one thread per block on devices without local memory; the `core0` axis on a host target with threads) and
    compiled by its compiler; the foreign program is one of another installed device (PYTHON, or CPU on PYTHON)."""
    from lazygrad_uop.registry import Device

    dev = Device[name]
    renderer = dev.renderer
    block = 4 if renderer.has_local else 1

    def compiled(device: CompiledDevice, prog: str) -> Program:
        uops = add_kernel_uops(prog, 4 if device.renderer.has_local else 1, host_threads=device.renderer.has_threads)
        return device.load_program(prog, device.compiler.compile(device.renderer.render(uops)))

    def upload(x: np.ndarray) -> Any:
        handle = dev.allocator.alloc(x.nbytes)
        dev.allocator.copyin(handle, memoryview(np.ascontiguousarray(x)).cast("B"))
        return handle

    def download(handle: Any, n: int) -> np.ndarray:
        dev.synchronize()
        out = np.empty(n, np.float32)
        dev.allocator.copyout(memoryview(out).cast("B"), handle)
        return out

    other = "CPU" if Device.canonicalize(name).split(":")[0] == "PYTHON" else "PYTHON"
    return GraphHarness(
        dev, block, lambda prog: compiled(dev, prog), upload, download, lambda: compiled(Device[other], "lg_foreign")
    )
