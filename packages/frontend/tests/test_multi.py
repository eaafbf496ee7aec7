"""Tensors on several devices (CPU:0..3): every sharded op against numpy and against the same computation on one
device, gradients included; re-sharding, the all-reduces, the JIT, and training steps (data and model parallel)."""

from __future__ import annotations

import os
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad import Tensor, TinyJit, nn
from lazygrad.engine import BufferCopy
from lazygrad.jit import _GraphStep
from lazygrad.multi import MultiDeviceError, all_reduce, multi, ring_chosen
from lazygrad.nn.optim import SGD, Adam
from lazygrad.nn.state import get_parameters
from lazygrad_uop.config import Context
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.shape import device_of

# CPU:0..3 by default; MULTI_TEST_DEVICES=CUDA,CUDA:1,CUDA:2,CUDA:3 with CUDA_GPUS=0,0,0,0 runs the suite on one GPU
# mapped four times (packages/runtime-cuda/tests/test_gpu.py does that where there is a GPU)
DEVS = tuple(os.environ.get("MULTI_TEST_DEVICES", "CPU,CPU:1,CPU:2,CPU:3").split(","))
DEVS2 = DEVS[:2]
RNG = np.random.default_rng(0)


def ints(*shape: int) -> np.ndarray:
    return RNG.integers(-9, 10, size=shape).astype(np.int32)


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def parts(t: Tensor) -> list[np.ndarray]:
    return [Tensor(u).numpy() for u in t.uop.src]


# *** placement ***


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_shard_splits_along_the_axis_and_gathers_back(axis: int | None) -> None:
    a = ints(8, 12)
    t = Tensor(a).shard(DEVS, axis)
    assert t.device == DEVS and t.shape == a.shape
    assert [device_of(u) for u in t.uop.src] == list(DEVS)
    expected = [a] * 4 if axis is None else np.split(a, 4, axis=axis)
    for got, want in zip(parts(t), expected):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.to(DEVS[2]).numpy(), a)
    assert t.to(DEVS[2]).device == DEVS[2]


@pytest.mark.parametrize("axis", [0, 1])
def test_gathering_keeps_signed_zeros(axis: int) -> None:
    a = np.array([[-0.0, 0.0, 1.5, -0.0], [0.0, -0.0, -np.inf, -0.0]], np.float32)
    t = Tensor(a).shard(DEVS[:2], axis)
    for got in (t.numpy(), t.to(DEVS[1]).numpy()):
        np.testing.assert_array_equal(np.signbit(got), np.signbit(a))
        np.testing.assert_array_equal(got, a)


def test_tensors_made_on_a_tuple_of_devices_are_replicated() -> None:
    t = Tensor([[1, 2], [3, 4]], device=DEVS2)
    assert t.device == DEVS2 and t.shard_axis is None
    for p in parts(t):
        np.testing.assert_array_equal(p, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(Tensor.zeros(2, 3, device=DEVS).numpy(), np.zeros((2, 3)))
    assert Tensor.ones(3, device=DEVS2).to(DEVS2).device == DEVS2


def test_reshard_between_axes_and_device_sets() -> None:
    a = ints(8, 4, 12)
    t = Tensor(a).shard(DEVS, 0)
    for axis in (1, 2, None, 0):
        r = t.shard(DEVS, axis)
        assert r.shard_axis == axis
        for got, want in zip(parts(r), [a] * 4 if axis is None else np.split(a, 4, axis=axis)):
            np.testing.assert_array_equal(got, want)
    moved = t.shard((DEVS[3], DEVS[2]), 1)
    assert moved.device == (DEVS[3], DEVS[2])
    np.testing.assert_array_equal(moved.numpy(), a)


def test_bad_placements_raise_with_the_fix() -> None:
    with pytest.raises(ValueError, match="evenly over 4 devices"):
        Tensor(ints(6, 2)).shard(DEVS, 0)
    with pytest.raises(ValueError, match="names a device twice"):
        Tensor(ints(4)).shard((DEVS[1], DEVS[1].lower()))
    with pytest.raises(TypeError, match="tuple of device names"):
        Tensor(ints(4)).shard(DEVS[1])  # type: ignore[arg-type]
    a, b = Tensor(ints(4, 4)).shard(DEVS, 0), Tensor(ints(4, 4)).shard(DEVS2, 0)
    with pytest.raises(ValueError, match="different devices"):
        a + b
    with pytest.raises(MultiDeviceError, match="onto the same devices"):
        a.assign(b)
    with pytest.raises(ValueError, match="different devices"):
        a + Tensor(ints(4, 4))
    with pytest.raises(MultiDeviceError, match="distinct devices"):
        multi([Tensor(ints(2)).uop, Tensor(ints(2)).uop], 0)


# *** elementwise and reductions, exact on ints ***


@pytest.mark.parametrize(("ax", "bx"), [(0, 0), (0, None), (None, 1), (0, 1), (None, None)])
def test_elementwise_on_any_two_placements(ax: int | None, bx: int | None) -> None:
    a, b, c = ints(4, 8), ints(4, 8), ints(8)
    ta, tb = Tensor(a).shard(DEVS, ax), Tensor(b).shard(DEVS, bx)
    tc = Tensor(c).shard(DEVS, None if bx != 1 else 0)
    out = (ta * tb + 3) // 2 - tc + (ta < tb).where(ta, -tb).maximum(tb)
    want = (a * b + 3) // 2 - c + np.maximum(np.where(a < b, a, -b), b)
    np.testing.assert_array_equal(out.numpy(), want)
    assert out.device == DEVS


@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("ring", [False, True])
def test_reductions_over_and_across_the_sharded_axis(axis: int | None, ring: bool) -> None:
    a = ints(8, 12)
    t = Tensor(a).shard(DEVS, axis)
    with Context(RING_MIN_BYTES=0 if ring else 1 << 30):
        for red in (0, 1, None, (0, 1)):
            np.testing.assert_array_equal(t.sum(red).numpy(), a.sum(red))
            np.testing.assert_array_equal(t.max(red).numpy(), a.max(red))
            np.testing.assert_array_equal(t.min(red).numpy(), a.min(red))
        np.testing.assert_array_equal(t.prod(0).numpy(), a.astype(np.int64).prod(0))
        total = t.sum()
    assert total.device == DEVS and total.shard_axis is None
    assert all(int(p) == int(a.sum()) for p in parts(total))


@given(n=st.integers(1, 40), ndev=st.integers(2, 4))
def test_ring_and_direct_all_reduce_agree_with_numpy(n: int, ndev: int) -> None:
    data = [ints(n, 3) for _ in range(ndev)]
    srcs = [Tensor(d, device=dev).uop for d, dev in zip(data, DEVS)]
    for ring in (False, True):
        for op, ref in ((Ops.ADD, np.sum), (Ops.MAX, np.max)):
            out = Tensor(multi(all_reduce(op, srcs, ring=ring), None))
            for p in parts(out):
                np.testing.assert_array_equal(p, ref(np.stack(data), axis=0))


def test_float_all_reduce_copies_agree_bit_for_bit() -> None:
    t = Tensor(floats(4, 1000)).shard(DEVS, 0)
    for bound in (0, 1 << 30):
        with Context(RING_MIN_BYTES=bound):
            got = parts(t.sum(0))
        assert all(np.array_equal(got[0], g) for g in got[1:])
        np.testing.assert_allclose(got[0], t.numpy().sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("n", "ring"), [(2, False), (4, False), (3, True), (4, None)])
def test_cpu_all_reduce_reads_each_input_once_and_writes_each_output_once(n: int, ring: bool | None) -> None:
    """ring=None: the choice by size, which for devices sharing the host's memory is the direct one at any size
    (here above RING_MIN_BYTES, where devices that copy bytes take the ring)."""
    if not all(d.startswith("CPU") for d in DEVS):
        pytest.skip("only devices that share the host's memory read each other's buffers in place")
    devices, data = DEVS[:n], floats(n, 999)

    @TinyJit
    def reduce(t: Tensor) -> Tensor:
        return Tensor(multi(all_reduce(Ops.ADD, list(t.uop.src), ring=ring), None)).realize()

    x = Tensor.from_shards([Tensor(data[i], device=d) for i, d in enumerate(devices)], 0).realize()
    with Context(RING_MIN_BYTES=0):
        for _ in range(3):
            got = parts(reduce(x))
    assert all(np.array_equal(got[0], g) for g in got[1:])  # the replicas are the same bits
    np.testing.assert_allclose(got[0], data.sum(0), rtol=1e-5, atol=1e-5)
    assert not any(isinstance(ei.runner, BufferCopy) for ei in reduce.jit_cache)
    if ring:
        # each element is summed once, by the device owning its chunk (reading the n parts' chunks, writing its own),
        # then one kernel gathers the chunks into every replica
        *chunks, gather = reduce.jit_cache
        assert len(chunks) == n and all(len(ei.bufs) == n + 1 and ei.bufs[0].size == 999 // n for ei in chunks)
        assert {b.device for b in gather.bufs} == set(devices) and len(gather.bufs) == 2 * n
    else:  # one kernel: every input read once, every replica written once
        assert len(reduce.jit_cache) == 1 and reduce.jit_cache[0].cost({})[1] == 2 * n * data[0].nbytes


def test_the_ring_is_chosen_by_size_between_devices_that_copy_bytes() -> None:
    """Above RING_MIN_BYTES per device the ring, at or below it the direct all-reduce; devices that read each
    other's memory in place (CPU:N) always the direct one. Both agree with numpy either way."""
    data = [ints(250) for _ in range(4)]  # 1000 bytes per device
    for devices, in_place in ((("CPU", "CPU:1", "CPU:2", "CPU:3"), True), (("PYTHON", "PYTHON:1", "PYTHON:2"), False)):
        srcs = [Tensor(d, device=dev).uop for d, dev in zip(data, devices)]
        for bound in (0, 999, 1000, 1 << 20):
            with Context(RING_MIN_BYTES=bound):
                assert ring_chosen(srcs) == (not in_place and 1000 > bound)
                out = Tensor(multi(all_reduce(Ops.ADD, srcs), None))
                for p in parts(out):
                    np.testing.assert_array_equal(p, np.sum(data[: len(devices)], axis=0))
    assert not ring_chosen(srcs[:1])


# *** matmul ***


@pytest.mark.parametrize(("xa", "wa"), [(0, None), (None, 1), (1, 0), (0, 1), (None, 0)])
def test_matmul_with_either_operand_sharded(xa: int | None, wa: int | None) -> None:
    x, w = ints(8, 12), ints(12, 16)
    out = Tensor(x).shard(DEVS, xa) @ Tensor(w).shard(DEVS, wa)
    np.testing.assert_array_equal(out.numpy(), x @ w)


# *** movement ***


MOVES = {
    "reshape keeps the axis": lambda t: t.reshape(2, 4, 3, 4),
    "reshape merges after the axis": lambda t: t.reshape(8, 12).reshape(96),
    "reshape cuts the axis": lambda t: t.reshape(4, 2, 12).permute(1, 0, 2).reshape(8, 12),
    "permute": lambda t: t.permute(1, 0),
    "transpose back": lambda t: t.T.T,
    "expand": lambda t: t.reshape(8, 1, 12).expand(8, 3, 12),
    "pad other axis": lambda t: t.pad(((0, 0), (1, 2))),
    "pad sharded axis": lambda t: t.pad(((1, 3), (0, 0))),
    "shrink other axis": lambda t: t[:, 2:7],
    "shrink sharded axis": lambda t: t[1:6],
    "stride": lambda t: t[::2, ::3],
    "flip sharded axis": lambda t: t.flip(0),
    "flip other axis": lambda t: t.flip(1),
    "cat": lambda t: t.cat(t * 2, dim=1),
}


@pytest.mark.parametrize("move", MOVES)
@pytest.mark.parametrize("axis", [0, 1, None])
def test_movement_ops_keep_or_move_the_sharded_axis(move: str, axis: int | None) -> None:
    a = ints(8, 12)
    fn = MOVES[move]
    out = fn(Tensor(a).shard(DEVS, axis))
    want = fn(Tensor(a)).numpy()
    assert out.device == DEVS
    np.testing.assert_array_equal(out.numpy(), want)


# *** autograd ***


GRAD_FNS = {
    "elementwise": lambda x, w: ((x * w).exp() + x.relu() * 2 - w.sigmoid()).sum(),
    "mean across shards": lambda x, w: (x - w).square().mean(),
    "max": lambda x, w: (x * w).max(0).sum() + x.max(),
    "matmul": lambda x, w: (x @ w.T).tanh().sum(),
    "movement": lambda x, w: (
        (x.permute(1, 0).reshape(4, 16) * w.T.reshape(4, 16)).flip(0)[1:].pad(((1, 1), (0, 2))).sum()
    ),
    "log softmax": lambda x, w: (x @ w.T).log_softmax(1).sum(),
}


@pytest.mark.parametrize("fn", GRAD_FNS)
@pytest.mark.parametrize(("xa", "wa"), [(0, None), (None, 0), (1, 1), (0, 1)])
def test_gradients_match_one_device(fn: str, xa: int | None, wa: int | None) -> None:
    xs, ws = floats(8, 8), floats(8, 8)
    f = GRAD_FNS[fn]
    x1, w1 = Tensor(xs, requires_grad=True), Tensor(ws, requires_grad=True)
    f(x1, w1).backward()
    xm = Tensor(xs).shard(DEVS, xa).requires_grad_()
    wm = Tensor(ws).shard(DEVS, wa).requires_grad_()
    loss = f(xm, wm)
    loss.backward()
    assert xm.grad is not None and wm.grad is not None
    assert xm.grad.device == DEVS and xm.grad.shard_axis == xa and wm.grad.shard_axis == wa
    np.testing.assert_allclose(loss.numpy(), f(Tensor(xs), Tensor(ws)).numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(xm.grad.numpy(), x1.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wm.grad.numpy(), w1.grad.numpy(), rtol=1e-4, atol=1e-4)
    # a replicated gradient is the same on every device
    if wa is None:
        got = parts(wm.grad)
        assert all(np.array_equal(got[0], g) for g in got[1:])


def test_gradient_with_an_explicit_sharded_seed() -> None:
    xs, seed = floats(8, 4), floats(8, 4)
    x = Tensor(xs).shard(DEVS, 0).requires_grad_()
    (gx,) = (x * x).gradient(x, gradient=Tensor(seed).shard(DEVS, 1))
    np.testing.assert_allclose(gx.numpy(), 2 * xs * seed, rtol=1e-6)


# *** JIT ***


def test_jit_replays_a_multi_device_step() -> None:
    w = Tensor(floats(6, 5)).shard(DEVS, None)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        h = (x @ w).relu().contiguous()  # two kernels on each device
        return (h.sum(1) * 2).realize()

    for _ in range(4):
        xs = floats(8, 6)
        out = step(Tensor(xs).shard(DEVS, 0))
        np.testing.assert_allclose(out.numpy(), np.maximum(xs @ w.numpy(), 0).sum(1) * 2, rtol=1e-5, atol=1e-5)
    devices = {ei.bufs[0].device for ei in step.jit_cache}
    assert devices == set(DEVS)
    # each device's kernels are replayed together, as one device graph, though the capture interleaved them
    assert step.captured is not None
    graphs = [s for s in step.captured.steps if isinstance(s, _GraphStep)]
    if getattr(Device[DEVS[0]], "graph", None) is not None:  # devices without a graph type replay kernel by kernel
        assert {g.graph.device.device for g in graphs} == set(DEVS)


@pytest.mark.parametrize("axis", [0, None])
def test_jit_returns_new_multi_device_tensors_each_call(axis: int | None) -> None:
    # a result on several devices is one buffer per device: each replay must return new tensors over this call's
    # buffers, and the earlier results (and arrays read from them) keep their values
    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x * 2 + 1).realize()

    inputs = [ints(8, 3) for _ in range(4)]
    outs = [step(Tensor(xs).shard(DEVS, axis)) for xs in inputs]
    for xs, out in zip(inputs, outs):
        assert out.uop.op is Ops.MULTI and out.uop.arg == axis
        np.testing.assert_array_equal(out.numpy(), xs * 2 + 1)
    assert len({id(o) for o in outs}) == len(outs)


def test_jit_keeps_a_multi_device_result_anything_still_reads() -> None:
    # a replay reuses the last call's result buffers only where nothing reads them: one device's part held alone,
    # or a lazy op over the whole, keeps those parts from being overwritten
    @TinyJit
    def step(x: Tensor) -> Tensor:
        return x.sum(0).realize()  # an all-reduce: replicated on every device

    for _ in range(3):
        step(Tensor(ints(4, 6)).shard(DEVS, 0))
    inputs = [ints(4, 6) for _ in range(4)]
    held = []
    for k, xs in enumerate(inputs):
        out = step(Tensor(xs).shard(DEVS, 0))
        held.append(Tensor(out.uop.src[-1]) if k % 2 else out * 3)
    for k, (xs, h) in enumerate(zip(inputs, held)):
        np.testing.assert_array_equal(h.numpy(), xs.sum(0) * (1 if k % 2 else 3))


def test_jit_reuses_dropped_multi_device_results() -> None:
    # results nothing reads any more are written again in place: no buffer is allocated per call
    @TinyJit
    def step(x: Tensor) -> Tensor:
        return x.sum(0).realize()

    x = Tensor(ints(4, 6)).shard(DEVS, 0).realize()
    for _ in range(3):
        step(x)
    assert step.captured is not None and len(step.captured.outputs) == len(DEVS)
    first = [weakref.ref(r.buf) for r in step.captured.outputs]  # weak: a reference would count as a reader
    for _ in range(3):
        np.testing.assert_array_equal(step(x).numpy(), x.numpy().sum(0))
    assert [r.buf for r in step.captured.outputs] == [ref() for ref in first]


@pytest.mark.parametrize("devices", [DEVS, ("PYTHON", "PYTHON:1")])
def test_jit_captures_the_all_reduce(devices: tuple[str, ...]) -> None:
    @TinyJit
    def total(x: Tensor) -> Tensor:
        return x.sum(0).realize()

    for _ in range(3):
        xs = ints(8, 5)
        np.testing.assert_array_equal(total(Tensor(xs).shard(devices, 0)).numpy(), xs.sum(0))
    copies = [ei for ei in total.jit_cache if isinstance(ei.runner, BufferCopy)]
    if all(d.startswith("CPU") for d in devices):
        # CPU devices share the host's memory: the kernels read the other devices' partial sums in place, no copies
        assert not copies
        assert any(len({b.device for b in ei.bufs}) > 1 for ei in total.jit_cache)
    else:
        assert copies
        assert all(len({b.device for b in ei.bufs}) == 1 for ei in total.jit_cache if ei not in copies)


# *** training ***


class ConvNet:
    def __init__(self) -> None:
        self.c1, self.c2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 2 * 2, 3)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.c2(self.c1(x).relu().max_pool2d(2)).relu().max_pool2d(2)
        return self.fc(x.flatten(1))


def _train_convnet(devices: tuple[str, ...] | None, xs: np.ndarray, ys: np.ndarray, steps: int) -> list[float]:
    Tensor.manual_seed(1)
    model = ConvNet()
    params = get_parameters(model)
    if devices is not None:
        for p in params:
            p.shard_(devices)  # replicated weights
    opt = Adam(params, lr=0.01)
    losses = []
    with Tensor.train():
        for i in range(steps):
            x, y = Tensor(xs[i]), Tensor(ys[i])
            if devices is not None:
                x, y = x.shard(devices, 0), y.shard(devices, 0)  # the batch split over the devices
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses + [float(p.numpy().sum()) for p in params]


def test_data_parallel_convnet_training_matches_one_device() -> None:
    xs, ys = floats(2, 8, 1, 8, 8), RNG.integers(0, 3, size=(2, 8)).astype(np.int32)
    one = _train_convnet(None, xs, ys, 2)
    four = _train_convnet(DEVS, xs, ys, 2)
    np.testing.assert_allclose(four, one, rtol=1e-4, atol=1e-4)


def test_model_parallel_linear_layer_training_matches_one_device() -> None:
    xs, ys = floats(4, 6, 10), floats(4, 6, 8)

    def train(devices: tuple[str, ...] | None) -> list[np.ndarray]:
        Tensor.manual_seed(2)
        layer = nn.Linear(10, 8)
        if devices is not None:
            layer.weight.shard_(devices, 0)  # each device holds 2 of the 8 output features
            layer.bias.shard_(devices, 0)
        opt = SGD([layer.weight, layer.bias], lr=0.1, momentum=0.9)
        for i in range(4):
            x, y = Tensor(xs[i]), Tensor(ys[i])
            if devices is not None:
                x, y = x.shard(devices), y.shard(devices, 1)
            opt.zero_grad()
            ((layer(x) - y).square().mean()).backward()
            opt.step()
        assert devices is None or layer.weight.shard_axis == 0
        return [layer.weight.numpy(), layer.bias.numpy()]

    for got, want in zip(train(DEVS), train(None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# *** copies between devices ***


def test_copies_between_cpu_devices_skip_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from lazygrad_cpu.allocator import CPUAllocator

    a = floats(1000)
    src = Tensor(a, device="CPU:1").realize()

    def no_staging(*args: object) -> None:
        raise AssertionError("a copy between two CPU devices went through a host staging buffer")

    monkeypatch.setattr(CPUAllocator, "_copyout", no_staging)
    out = (src.to("CPU:2") + 1).realize()
    monkeypatch.undo()
    np.testing.assert_array_equal(out.numpy(), a + 1)


def test_cpu_devices_read_views_of_each_others_values_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    import lazygrad.engine as engine

    a = floats(6, 4)
    y = Tensor(a, device="CPU:1") * 2  # computed on CPU:1, stored there once, read by CPU:2 through a view

    def no_copy(*args: object, **kwargs: object) -> None:
        raise AssertionError("a copy between two CPU devices ran: a kernel could have read the value in place")

    monkeypatch.setattr(engine.BufferCopy, "__call__", no_copy)

    @TinyJit
    def step(t: Tensor) -> Tensor:
        return (t.to("CPU:2").T[1:, ::2] + 1).realize()

    for _ in range(3):
        out = step(y.realize())
        np.testing.assert_array_equal(out.numpy(), (a * 2).T[1:, ::2] + 1)
        assert out.device == "CPU:2"
    devices = [{b.device for b in ei.bufs} for ei in step.jit_cache]
    assert devices == [{"CPU:2", "CPU:1"}]


def test_a_kernel_never_takes_a_buffer_of_a_device_it_cant_address() -> None:
    a, b = Tensor(ints(4), device="PYTHON").realize(), Tensor(ints(4), device="PYTHON:1").realize()
    mixed = Tensor(a.uop.alu(Ops.ADD, b.uop))  # no COPY between them: not something Tensor ops build
    with pytest.raises(ValueError, match="PYTHON can't address; move the tensor there first"):
        mixed.realize()


def test_python_devices_are_distinct_devices_too() -> None:
    a = ints(4, 3)
    t = Tensor(a, device="PYTHON").shard(("PYTHON", "PYTHON:1"), 0)
    assert [device_of(u) for u in t.uop.src] == ["PYTHON", "PYTHON:1"]
    np.testing.assert_array_equal((t * 2).sum(0).numpy(), (a * 2).sum(0))


def test_from_shards_joins_parts_already_on_their_devices() -> None:
    a = ints(8, 3)
    t = Tensor.from_shards([Tensor(p, device=d) for p, d in zip(np.split(a, 4), DEVS)], 0)
    assert t.device == DEVS and t.shard_axis == 0
    np.testing.assert_array_equal((t + 1).numpy(), a + 1)
    with pytest.raises(ValueError, match="one shape and dtype"):
        Tensor.from_shards([Tensor(ints(2)), Tensor(ints(3), device="CPU:1")])
    with pytest.raises(MultiDeviceError, match="distinct devices"):
        Tensor.from_shards([Tensor(ints(2)), Tensor(ints(2))])


def test_random_values_on_several_devices_are_those_of_one_device() -> None:
    Tensor.manual_seed(5)
    one = Tensor.rand(8, 3).numpy()
    Tensor.manual_seed(5)
    many = Tensor.rand(8, 3, device=DEVS2)
    assert many.device == DEVS2
    np.testing.assert_array_equal(many.numpy(), one)
    x = Tensor(floats(8, 3)).shard(DEVS2, 0)
    with Tensor.train():
        dropped = x.dropout(0.5).numpy()
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], 2 * x.numpy()[kept], rtol=1e-6)
    assert 0 < kept.sum() < kept.size
