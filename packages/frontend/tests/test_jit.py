"""TinyJit: capture on the second call, replay after; input checks; a training step that matches the un-jitted run
bit for bit; the CPU graph that replays captured kernels as one native call. References are numpy and an
un-jitted run of the same code."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from lazygrad import Context, JitError, Tensor, TinyJit, dtypes, nn
from lazygrad.engine import get_runner
from lazygrad.jit import _GraphStep
from lazygrad.nn.optim import SGD, Adam
from lazygrad.nn.state import get_parameters
from lazygrad_cpu.graph import CPUGraph
from lazygrad_uop.device import GraphError
from lazygrad_uop.registry import Device

RNG = np.random.default_rng(7)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_replays_with_new_inputs_without_running_the_function() -> None:
    calls = []

    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        calls.append(1)
        return ((a + b).relu().contiguous() * 2).sum(axis=1)

    for _ in range(5):
        a, b = _f32(4, 8), _f32(4, 8)
        out = f(Tensor(a), Tensor(b)).numpy()
        np.testing.assert_allclose(out, (np.maximum(a + b, 0) * 2).sum(1), rtol=1e-5)
    assert len(calls) == 2  # the plain run and the capture; the other three replayed
    assert len(f.jit_cache) >= 2


def test_replays_never_overwrite_earlier_results() -> None:
    f = TinyJit(lambda x: (x * 3).contiguous())
    outs, arrays = [], []
    for i in range(6):
        out = f(Tensor(np.full(5, i, np.float32)))
        outs.append(out)
        arrays.append(out.numpy())  # a view of the device memory on the CPU: the result's buffer must stay its own
    for i, (out, arr) in enumerate(zip(outs, arrays, strict=True)):
        np.testing.assert_array_equal(out.numpy(), np.full(5, 3 * i, np.float32))
        np.testing.assert_array_equal(arr, np.full(5, 3 * i, np.float32))


def test_numpy_view_alone_keeps_a_result() -> None:
    f = TinyJit(lambda x: (x + 1).contiguous())
    arrays = [f(Tensor(np.full(3, i, np.float32))).numpy() for i in range(5)]  # the tensors are dropped at once
    for i, arr in enumerate(arrays):
        np.testing.assert_array_equal(arr, np.full(3, i + 1, np.float32))


def test_replays_reuse_the_result_buffer_once_it_is_dropped() -> None:
    f = TinyJit(lambda x: (x * 2).contiguous())
    x = Tensor(np.ones(4, np.float32)).realize()
    for _ in range(3):
        f(x)
    assert f.captured is not None and len(f.captured.outputs) == 1
    first = weakref.ref(f.captured.outputs[0].buf)  # weak: a reference here would count as the result's reader
    for _ in range(3):
        f(x)  # the result is dropped at once: the next replay writes the same buffer, allocating nothing
    assert f.captured.outputs[0].buf is first()
    kept = f(x)
    f(x)
    assert f.captured.outputs[0].buf is not first()  # `kept` still reads it
    np.testing.assert_array_equal(kept.numpy(), np.full(4, 2, np.float32))


@pytest.mark.parametrize(
    "keep",
    [lambda out: out + 1, lambda out: out.reshape(2, 2).T, lambda out: out[1:], lambda out: Tensor(out.uop)],
    ids=["lazy op", "view", "shrink", "its node"],
)
def test_anything_over_a_dropped_result_keeps_it(keep: Callable[[Tensor], Tensor]) -> None:
    # a replay reuses the last call's result (buffer and graph nodes) only while nothing can read it: a lazy tensor
    # over it, or its node alone, keeps it from being overwritten
    f = TinyJit(lambda x: (x * 2).contiguous())
    for i in range(3):
        f(Tensor(np.full(4, i, np.float32)))
    kept = [(i, keep(f(Tensor(np.arange(4, dtype=np.float32) + i)))) for i in range(3, 8)]
    for i, k in kept:
        np.testing.assert_array_equal(k.numpy(), keep(Tensor((np.arange(4, dtype=np.float32) + i) * 2)).numpy())


def test_python_number_argument_that_changes_is_refused() -> None:
    @TinyJit
    def f(x: Tensor, scale: float, *, mode: str = "a") -> Tensor:
        return (x * scale).contiguous()

    x = Tensor(np.ones(3, np.float32)).realize()
    for _ in range(3):
        np.testing.assert_array_equal(f(x, 5.0).numpy(), np.full(3, 5, np.float32))
    with pytest.raises(JitError, match=r"argument 1 \('scale'\) .* was 5.0 .* is 6.0"):
        f(x, 6.0)
    with pytest.raises(JitError, match="keyword argument 'mode'"):
        f(x, 5.0, mode="b")
    np.testing.assert_array_equal(f(x, 5.0).numpy(), np.full(3, 5, np.float32))


def test_replays_on_the_same_tensors_reuse_their_inputs_and_see_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    from lazygrad import jit

    prepared = []
    real = jit._prepare_inputs
    monkeypatch.setattr(jit, "_prepare_inputs", lambda *a: prepared.append(1) or real(*a))

    @TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        return (x * 2 + y).contiguous()

    a, b, c, d = _f32(5), _f32(5), _f32(5), _f32(5)
    x, y = Tensor(a).realize(), Tensor(b).realize()
    for _ in range(4):
        np.testing.assert_array_equal(f(x, y).numpy(), a * 2 + b)
    assert len(prepared) == 1, "the same realized tensors are prepared once"
    # new contents in place (x keeps its node and buffer: nothing to prepare again), another tensor, a lazy one
    x.assign(Tensor(c)).realize()
    np.testing.assert_array_equal(f(x, y).numpy(), c * 2 + b)
    z = Tensor(d).realize()
    np.testing.assert_array_equal(f(z, y).numpy(), d * 2 + b)
    np.testing.assert_array_equal(f(z, y + 1).numpy(), d * 2 + (b + 1))
    assert len(prepared) == 3
    # a plain argument where the capture had none is still refused
    with pytest.raises(JitError, match="argument 2"):
        f(z, y, 3)  # type: ignore[call-arg]


def test_lazy_and_keyword_inputs() -> None:
    @TinyJit
    def f(x: Tensor, *, scale: Tensor) -> Tensor:
        return (x * scale).contiguous()

    for i in range(4):
        x, s = _f32(6), float(i + 1)
        out = f(Tensor(x) + 1, scale=Tensor([s]).expand(6))  # lazy inputs are realized before the call
        np.testing.assert_allclose(out.numpy(), (x + 1) * np.float32(s), rtol=1e-6)


def test_as_a_method_decorator() -> None:
    class Model:
        def __init__(self) -> None:
            self.w = Tensor(_f32(3, 3)).realize()

        @TinyJit
        def __call__(self, x: Tensor) -> Tensor:
            return (x @ self.w).realize()

    m = Model()
    for _ in range(4):
        x = _f32(2, 3)
        np.testing.assert_allclose(m(Tensor(x)).numpy(), x @ m.w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (lambda: Tensor(_f32(4, 5)), "shape"),
        (lambda: Tensor(_f32(4, 4).astype(np.float16)), "half"),
        (lambda: Tensor(_f32(4, 4)).realize().T, "view"),
    ],
    ids=["shape", "dtype", "view"],
)
def test_inputs_must_keep_shape_dtype_and_view(second, message: str) -> None:
    f = TinyJit(lambda x: (x + 1).contiguous())
    for _ in range(3):
        f(Tensor(_f32(4, 4)))
    with pytest.raises(JitError, match=message):
        f(second())


def test_inputs_must_keep_their_device() -> None:
    if Device.usable("PYTHON") is not None:
        pytest.skip("the PYTHON device is not usable here")
    f = TinyJit(lambda x: (x + 1).contiguous())
    f(Tensor(_f32(3)))
    f(Tensor(_f32(3)))
    with pytest.raises(JitError, match="PYTHON"):
        f(Tensor(_f32(3), device="PYTHON"))


def test_number_of_inputs_and_shared_buffers_are_checked() -> None:
    f = TinyJit(lambda *xs: sum(xs[1:], xs[0]).contiguous())
    a = Tensor(_f32(3)).realize()
    f(a, Tensor(_f32(3)))
    with pytest.raises(JitError, match="share a buffer"):
        f(a, a)
    with pytest.raises(JitError, match="2 tensor inputs"):
        f(a, Tensor(_f32(3)), Tensor(_f32(3)))


def test_jit_off_runs_the_function_every_time() -> None:
    calls = []

    def f(x: Tensor) -> Tensor:
        calls.append(1)
        return (x + 1).realize()

    jf = TinyJit(f)
    with Context(JIT=0):
        for _ in range(3):
            jf(Tensor(_f32(2)))
    assert len(calls) == 3 and jf.jit_cache == []


def test_reset_captures_again() -> None:
    f = TinyJit(lambda x: (x + 1).contiguous())
    for _ in range(3):
        f(Tensor(_f32(2)))
    f.reset()
    x = _f32(7)
    for _ in range(3):
        np.testing.assert_allclose(f(Tensor(x)).numpy(), x + 1)


class _MLP:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(12, 32), nn.Linear(32, 5)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def _training_step(model: _MLP, opt: Any, jit: bool) -> Callable[[Tensor, Tensor], Tensor]:
    """One training step of `model` with `opt` on a batch `(x, y)`, returning the realized loss; jitted or not."""

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            return loss.realize()

    return TinyJit(step) if jit else step


def _train(jit: bool, optimizer: type, steps: int = 10) -> tuple[list[float], list[np.ndarray]]:
    Tensor.manual_seed(3)
    model = _MLP()
    run = _training_step(model, optimizer(get_parameters(model), lr=0.05), jit)
    rng = np.random.default_rng(11)
    x_all = rng.standard_normal((48, 12)).astype(np.float32)
    y_all = (x_all[:, :5].argmax(1)).astype(np.int32)  # a learnable labelling
    losses = []
    for i in range(steps):
        batch = slice(16 * (i % 3), 16 * (i % 3 + 1))
        losses.append(run(Tensor(x_all[batch]), Tensor(y_all[batch])).item())
    if jit:
        assert isinstance(run, TinyJit) and run.cnt == steps and len(run.jit_cache) > 0
    return losses, [p.numpy().copy() for p in get_parameters(model)]


def test_twenty_losses_collected_from_a_jitted_step_match_the_unjitted_sequence() -> None:
    def losses(jit: bool) -> list[np.ndarray]:
        Tensor.manual_seed(5)
        model = _MLP()
        run = _training_step(model, SGD(get_parameters(model), lr=0.05), jit)
        rng = np.random.default_rng(2)
        collected = []
        for _ in range(20):
            x = rng.standard_normal((8, 12)).astype(np.float32)
            collected.append(run(Tensor(x), Tensor(x[:, :5].argmax(1).astype(np.int32))))
        return [t.numpy() for t in collected]  # read only at the end: every loss tensor must still hold its value

    plain, jitted = losses(False), losses(True)
    assert len({float(v) for v in plain}) == 20
    for a, b in zip(plain, jitted, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optimizer", [Adam, SGD], ids=["Adam", "SGD"])
def test_training_step_matches_unjitted_bit_for_bit(optimizer: type) -> None:
    losses, params = _train(False, optimizer)
    jit_losses, jit_params = _train(True, optimizer)
    assert jit_losses == losses
    assert sum(losses[-3:]) < sum(losses[:3])  # it does train
    for p, q in zip(params, jit_params, strict=True):
        np.testing.assert_array_equal(p, q)


def test_hand_written_linear_regression_with_assign() -> None:
    """Gradient descent written out by hand (no autograd): the update is an in-place assign inside the jit."""
    x_np, w_true = _f32(64, 3), np.array([[1.5], [-2.0], [0.5]], np.float32)
    w = Tensor.zeros(3, 1).contiguous().realize()

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        err = x @ w - y
        w.assign(w - 0.1 * (x.T @ err) / x.shape[0])
        return (err * err).mean().realize(w)

    w_ref = np.zeros((3, 1), np.float32)
    for _ in range(10):
        y = x_np @ w_true
        step(Tensor(x_np), Tensor(y))
        w_ref = w_ref - np.float32(0.1) * (x_np.T @ (x_np @ w_ref - y)) / np.float32(64)
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-5)


def test_cpu_kernels_replay_as_one_graph() -> None:
    @TinyJit
    def chain(x: Tensor) -> Tensor:
        for _ in range(20):
            x = (x * 1.5 - 1).contiguous()
        return x

    x = _f32(33)
    for _ in range(4):
        out = chain(Tensor(x)).numpy()
    ref = x.copy()
    for _ in range(20):
        ref = ref * np.float32(1.5) - np.float32(1)
    np.testing.assert_allclose(out, ref, rtol=1e-5)
    steps = chain.captured.steps
    assert len(steps) == 1 and isinstance(steps[0], _GraphStep) and isinstance(steps[0].graph, CPUGraph)


def test_cpu_graph_update_swaps_buffers_and_values() -> None:
    """CPUGraph directly: two launches of one kernel, then the second given other buffers."""
    a, b, c = (Tensor(v).realize() for v in (_f32(8), _f32(8), np.zeros(8, np.float32)))
    items = (a + b).schedule()
    runner = get_runner("CPU", items[0].ast)
    out = items[0].bufs[0].allocate()
    ins = [t._buffer_view()[0] for t in (a, b, c)]
    slots = [out, *items[0].bufs[1:]]
    graph = CPUGraph(Device["CPU"], [runner.launch(slots), runner.launch([out, ins[0], ins[0]])])
    graph()
    np.testing.assert_allclose(np.frombuffer(out.copyout(memoryview(bytearray(32))), np.float32), a.numpy() * 2)
    graph.update({1: runner.launch([out, ins[1], ins[2]])})
    assert graph(wait=True) is not None
    np.testing.assert_allclose(np.frombuffer(out.copyout(memoryview(bytearray(32))), np.float32), b.numpy())


def test_integer_and_multi_output_functions() -> None:
    @TinyJit
    def f(x: Tensor) -> tuple[Tensor, Tensor]:
        return (x * 2).realize(), (x.sum() + 1).realize()

    for i in range(4):
        x = np.arange(6, dtype=np.int32) + i
        y, s = f(Tensor(x))
        assert y.dtype == dtypes.int32
        np.testing.assert_array_equal(y.numpy(), x * 2)
        assert s.item() == x.sum() + 1


def test_graph_update_must_keep_the_program() -> None:
    a = Tensor(_f32(4)).realize()
    items = (a + 1).schedule() + (a * a.sum()).schedule()
    runners = [get_runner("CPU", si.ast) for si in items]
    for si in items:
        for b in si.bufs:
            if not b.is_allocated:
                b.allocate()
    launches = [r.launch(si.bufs) for r, si in zip(runners, items, strict=True)]
    graph = CPUGraph(Device["CPU"], launches)
    other = next(k for k, r in enumerate(runners) if r.program is not runners[0].program)
    with pytest.raises(GraphError, match="keep its program"):
        graph.update({0: launches[other]})


# *** random numbers: the generator's state is on the device and advanced by a captured kernel ***


def _draws(fn, calls: int, seed: int, x: Tensor) -> list[np.ndarray]:
    Tensor.manual_seed(seed)
    return [fn(x).numpy().copy() for _ in range(calls)]


def test_jitted_rand_draws_new_numbers_on_every_call() -> None:
    def f(x: Tensor) -> Tensor:
        return x + Tensor.rand(3, 4) + Tensor.randn(3, 4, contiguous=False)

    x = Tensor(np.zeros((3, 4), np.float32))
    jitted = _draws(TinyJit(f), 6, 21, x)
    plain = _draws(f, 6, 21, x)
    assert len({v.tobytes() for v in jitted}) == 6, "a replay repeated the numbers of an earlier call"
    for k, (a, b) in enumerate(zip(jitted, plain)):
        np.testing.assert_array_equal(a, b, err_msg=f"call {k}")


def test_jitted_dropout_masks_change_and_match_the_unjitted_sequence() -> None:
    def f(x: Tensor) -> Tensor:
        with Tensor.train():
            return x.dropout(0.5)

    x = Tensor(np.ones((8, 16), np.float32))
    jitted = _draws(TinyJit(f), 5, 22, x)
    plain = _draws(f, 5, 22, x)
    assert len({v.tobytes() for v in jitted}) == 5
    for a, b in zip(jitted, plain):
        assert set(np.unique(a).tolist()) <= {0.0, 2.0}
        np.testing.assert_array_equal(a, b)


def test_manual_seed_outside_and_inside_a_jitted_function() -> None:
    x = Tensor(np.zeros(5, np.float32))
    Tensor.manual_seed(23)
    expected = [Tensor.rand(5).numpy().copy() for _ in range(4)]
    f = TinyJit(lambda x: x + Tensor.rand(5))
    Tensor.manual_seed(23)
    for k in range(4):  # run, capture, replays
        np.testing.assert_array_equal(f(x).numpy(), expected[k])
    Tensor.manual_seed(23)  # outside: the next replay starts the sequence again
    np.testing.assert_array_equal(f(x).numpy(), expected[0])
    np.testing.assert_array_equal(f(x).numpy(), expected[1])

    def reseeded(x: Tensor) -> Tensor:
        Tensor.manual_seed(23)
        return x + Tensor.rand(5)

    g = TinyJit(reseeded)
    for _ in range(4):  # inside: every call, replays too, starts from the seed
        np.testing.assert_array_equal(g(x).numpy(), expected[0])
    # and the generator goes on from there after the jitted call
    np.testing.assert_array_equal(Tensor.rand(5).numpy(), expected[1])


def test_training_step_with_dropout_matches_unjitted_bit_for_bit() -> None:
    def train(jit: bool) -> list[float]:
        Tensor.manual_seed(4)
        l1, l2 = nn.Linear(12, 32), nn.Linear(32, 5)
        opt = SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.05)

        def step(x: Tensor, y: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                loss = l2(l1(x).relu().dropout(0.3)).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step()
                return loss.realize()

        run = TinyJit(step) if jit else step
        rng = np.random.default_rng(5)
        x, y = rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 5, 16).astype(np.int32)
        return [run(Tensor(x), Tensor(y)).item() for _ in range(6)]

    losses = train(False)
    assert len(set(losses)) == 6
    assert train(True) == losses


def test_backward_through_a_jitted_output_is_right_or_refused() -> None:
    w = Tensor(_f32(4, 3), requires_grad=True)
    f = TinyJit(lambda x: (x @ w).relu().realize())
    x0 = _f32(2, 4)
    out = f(Tensor(x0))  # the plain first run: an ordinary realized tensor
    out.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), x0.T @ (x0 @ w.numpy() > 0), rtol=1e-5, atol=1e-6)
    x1 = _f32(2, 4)
    captured = f(Tensor(x1))
    replayed = f(Tensor(_f32(2, 4)))  # the replay writes a buffer of its own: `captured` keeps its value and graph
    w.grad = None
    captured.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), x1.T @ (x1 @ w.numpy() > 0), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="TinyJit replay"):
        replayed.sum().backward()  # computed by the capture's kernels, whose graph is not the replay's


def test_replays_read_each_inputs_current_view_and_keep_no_input_alive() -> None:
    """The replay's per-input view cache is keyed by the input's node: a new view of another buffer is checked and
    read as itself, and the cache holds nothing of a dropped input."""
    from lazygrad.jit import _input_views

    f = TinyJit(lambda t: (t * 2).realize())
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for i in range(4):
        x = Tensor(a + i).realize()
        np.testing.assert_array_equal(f(x).numpy(), (a + i) * 2)
    with pytest.raises(JitError):
        f(Tensor(a).realize().T.contiguous().T)  # a transposed view of a buffer: another input layout
    gone = weakref.ref(x.uop)
    assert gone() in _input_views
    del x
    gc.collect()
    assert gone() is None
