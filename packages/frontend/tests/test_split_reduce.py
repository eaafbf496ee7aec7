"""Long reductions split into partial reductions (`lazygrad.split_reduce`) on every device against numpy: sum, max,
min, mean, argmax over long axes with and without a remainder, in many dtypes; float32 sums of 10^7 elements within
1e-6 of a float64 sum; row reductions (softmax, log_softmax, layernorm, RMS norm, cross-entropy, var) for widths
from 1 to 65,536 against torch; zero-size inputs to reductions and movement ops giving the empty or identity result
without launching a kernel that has nothing to write."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

import lazygrad.engine
from lazygrad import Tensor
from lazygrad_codegen.reductions import COLUMN_PART_ROWS, PARALLEL_MIN, SEQUENTIAL, accumulator_lanes
from lazygrad_uop.dtype import dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

RNG = np.random.default_rng(5)


def longest(device: str) -> int:
    """The longest reduction `device` leaves whole (with enough outputs)."""
    return accumulator_lanes(Device[device].renderer) * SEQUENTIAL


def lengths(device: str) -> list[int]:
    """Lengths a split reduction on `device` cuts with and without a remainder."""
    n = longest(device)
    return [4 * n, 3 * n + 7]


def bfloat16_values(a: np.ndarray) -> np.ndarray:
    """`a` rounded to the nearest bfloat16 (ties to even), as float32: the top 16 bits of each float32."""
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def values(shape: tuple[int, ...], dtype, rng: np.random.Generator = RNG) -> np.ndarray:
    if dtype == dtypes.bfloat16:
        # (numpy has no bfloat16: float32 values that bfloat16 holds exactly)
        return bfloat16_values(rng.standard_normal(shape))
    npdt = to_numpy_dtype(dtype)
    if dtype == dtypes.bool:
        return rng.random(shape) < 0.3
    if dtypes.is_int(dtype):
        info = np.iinfo(npdt)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(npdt)
    return rng.standard_normal(shape).astype(npdt)


def own_values(shape: tuple[int, ...], dtype) -> np.ndarray:
    """`values` from a generator of the shape's own: what a test draws doesn't depend on the tests run before it in
    this process (the shared generator's next draw does), nor changes what they draw."""
    return values(shape, dtype, np.random.default_rng(list(shape)))


@pytest.mark.parametrize(
    "dtype",
    [
        dtypes.float32,
        dtypes.float16,
        dtypes.bfloat16,
        dtypes.float64,
        dtypes.int64,
        dtypes.int32,
        dtypes.int16,
        dtypes.int8,
        dtypes.uint8,
        dtypes.bool,
    ],
)
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean", "argmax"])
def test_long_reductions_match_numpy(device: str, dtype, op: str) -> None:
    if device == "CL" and dtype not in (dtypes.float32, dtypes.int32):
        pytest.skip("PoCL takes seconds per kernel: CL runs float32 and int32, CPU and PYTHON every dtype")
    for n in lengths(device):
        a = values((n,), dtype)
        t = Tensor(a, device=device, dtype=dtype)
        got = getattr(t, op)()
        got = (got.float() if got.dtype == dtypes.bfloat16 else got).numpy()
        if op == "sum":
            want = a.sum(dtype=np.float64 if dtypes.is_float(dtype) else np.int64)
        elif op == "mean":
            want = a.astype(np.float64).mean()
        else:
            want = getattr(a, op)()
        tol = 1e-2 if dtype in (dtypes.float16, dtypes.bfloat16) else 1e-5
        np.testing.assert_allclose(np.asarray(got, np.float64), np.float64(want), rtol=tol, atol=tol, err_msg=f"n={n}")


def test_long_reductions_along_an_axis_of_a_matrix(device: str) -> None:
    n = lengths(device)[1]
    a = values((3, n), dtypes.float32)
    t = Tensor(a, device=device)
    np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1, dtype=np.float64), rtol=1e-5)
    np.testing.assert_array_equal(t.max(1).numpy(), a.max(1))
    np.testing.assert_array_equal(t.argmax(1).numpy(), a.argmax(1))
    # the long axis first: the reduced axis is not the contiguous one
    np.testing.assert_allclose(Tensor(a.T.copy(), device=device).sum(0).numpy(), a.sum(1), rtol=1e-5)
    np.testing.assert_allclose(t.sum(1, keepdim=True).numpy(), a.sum(1, keepdims=True), rtol=1e-5)


def test_long_reductions_are_split_into_parts(device: str) -> None:
    n = lengths(device)[0]
    items = Tensor(values((n,), dtypes.float32), device=device).sum().schedule()
    reductions = [si for si in items if any(u.op is Ops.REDUCE_AXIS for u in si.ast.toposort)]
    assert len(reductions) >= 2, "a partial reduction and the reduction of the parts"
    assert reductions[0].outputs[0].size >= 2


@pytest.mark.parametrize("device_name", ["CPU", "CL"])
def test_a_float32_sum_of_ten_million_is_within_1e_6(device_name: str) -> None:
    if device_name not in Device.installed() or Device.usable(device_name) is not None:
        pytest.skip(f"{device_name} is not usable here")
    for a in (np.full(10**7, 0.1, np.float32), RNG.random(10**7 + 3).astype(np.float32)):
        got = float(Tensor(a, device=device_name).sum().numpy())
        want = a.astype(np.float64).sum()
        assert abs(got - want) / want < 1e-6


def test_a_float32_sum_on_python_keeps_pairwise_accuracy() -> None:
    # 10^7 elements take the PYTHON interpreter ~25 s of CPU (the CPU and CL sum 10^7 above): 2^18 + 3 values of 0.1
    # summed in sequence in float32 are off by 2.5e-3, the split sum within 1e-6 as at 10^7
    a = np.full(2**18 + 3, 0.1, np.float32)
    want = a.astype(np.float64).sum()
    assert abs(float(np.cumsum(a)[-1]) - want) / want > 1e-3, "a sequential sum would fail the bound"
    got = float(Tensor(a, device="PYTHON").sum().numpy())
    assert abs(got - want) / want < 1e-6


def test_gradients_flow_through_split_reductions(device: str) -> None:
    torch = pytest.importorskip("torch")
    if device == "PYTHON":
        pytest.skip("compiling the backward's kernels takes the PYTHON device seconds (CPU and CL run it)")
    n = lengths(device)[1]
    a = values((n,), dtypes.float32)
    t = Tensor(a, device=device, requires_grad=True)
    (t.sum() * 2 + t.max()).backward()
    r = torch.tensor(a, requires_grad=True)
    (r.sum() * 2 + r.max()).backward()
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-6)


# *** row reductions ***

WIDTHS = [1, 2, 7, 31, 32, 33, 100, 257, 1000, 1024, 4097, 65536]


@pytest.mark.parametrize("width", WIDTHS)
def test_row_reductions_match_torch(device: str, width: int) -> None:
    torch = pytest.importorskip("torch")
    if width > {"PYTHON": 1024, "CL": 4097}.get(device, width):
        pytest.skip(f"{device} takes seconds on rows this wide (the CPU runs them)")
    rows = 3
    a = values((rows, width), dtypes.float32)
    t, r = Tensor(a, device=device), torch.tensor(a)
    w = values((width,), dtypes.float32)
    labels = RNG.integers(0, width, rows)
    checks = {
        "softmax": (t.softmax(-1), r.softmax(-1)),
        "log_softmax": (t.log_softmax(-1), r.log_softmax(-1)),
        "layernorm": (t.layernorm(), torch.nn.functional.layer_norm(r, (width,))),
        "rms_norm": (
            t * (t.square().mean(-1, keepdim=True) + 1e-6).rsqrt() * Tensor(w, device=device),
            torch.nn.functional.rms_norm(r, (width,), torch.tensor(w), 1e-6),
        ),
        "cross_entropy": (
            t.cross_entropy(Tensor(labels, device=device)),
            torch.nn.functional.cross_entropy(r, torch.tensor(labels)),
        ),
        "mean": (t.mean(-1), r.mean(-1)),
        "var": (t.var(-1), r.var(-1)) if width > 1 else (t.mean(-1), r.mean(-1)),
    }
    for name, (got, want) in checks.items():
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-4, atol=2e-5, err_msg=name)


# *** zero-size inputs ***

EMPTY_CASES = {
    "sum_all": (lambda t: t.sum(), lambda a: a.sum()),
    "sum_empty_axis": (lambda t: t.sum(0), lambda a: a.sum(0)),
    "sum_other_axis": (lambda t: t.sum(1), lambda a: a.sum(1)),
    "prod": (lambda t: t.prod(0), lambda a: a.prod(0)),
    "mean_other_axis": (lambda t: t.mean(1), lambda a: a.mean(1)),
    "max_other_axis": (lambda t: t.max(1), lambda a: a.max(1)),
    "argmax_other_axis": (lambda t: t.argmax(1), lambda a: a.argmax(1)),
    "cumsum": (lambda t: t.cumsum(0), lambda a: a.cumsum(0)),
    "cumsum_other": (lambda t: t.cumsum(1), lambda a: a.cumsum(1)),
    "tril": (lambda t: t.tril(), lambda a: np.tril(a)),
    "triu": (lambda t: t.triu(), lambda a: np.triu(a)),
    "cat": (lambda t: t.cat(t, dim=0), lambda a: np.concatenate([a, a], 0)),
    "cat_other": (lambda t: t.cat(t, dim=1), lambda a: np.concatenate([a, a], 1)),
    "matmul_empty_k": (lambda t: t.T @ t, lambda a: a.T @ a),
    "matmul_empty_m": (lambda t: t @ t.T, lambda a: a @ a.T),
    "add": (lambda t: t + 1, lambda a: a + 1),
    "permute": (lambda t: t.permute(1, 0).contiguous(), lambda a: a.T),
    "pad": (lambda t: t.pad(((1, 1), (0, 0))), lambda a: np.pad(a, ((1, 1), (0, 0)))),
    "flip": (lambda t: t.flip(0).contiguous(), lambda a: a[::-1]),
    "expand": (lambda t: t.reshape(1, 0, 3).expand(2, 0, 3).contiguous(), lambda a: np.broadcast_to(a, (2, 0, 3))),
    "softmax": (lambda t: t.softmax(0), lambda a: a),
    "log_softmax": (lambda t: t.log_softmax(1), lambda a: a),
    "min_other_axis": (lambda t: t.min(1), lambda a: a.min(1)),
    "argmin_other_axis": (lambda t: t.argmin(1), lambda a: a.argmin(1)),
    "prod_other_axis": (lambda t: t.prod(1), lambda a: a.prod(1)),
    "any_empty_axis": (lambda t: t.any(0), lambda a: a.any(0)),
    "all_empty_axis": (lambda t: t.all(0), lambda a: a.all(0)),
    "any_other_axis": (lambda t: t.any(1), lambda a: a.any(1)),
    "mean_empty_axis": (lambda t: t.mean(0), lambda a: np.full(3, np.nan, np.float32)),
    "var_other_axis": (lambda t: t.var(1), lambda a: a.var(1, ddof=1)),
    "var_empty_axis": (lambda t: t.var(0), lambda a: np.full(3, np.nan, np.float32)),
    "std_other_axis": (lambda t: t.std(1), lambda a: a.std(1, ddof=1)),
    "logsumexp_other_axis": (lambda t: t.logsumexp(1), lambda a: a.sum(1)),
    "logsumexp_empty_axis": (lambda t: t.logsumexp(0), lambda a: np.full(3, -np.inf, np.float32)),
    "sum_keepdim": (lambda t: t.sum(0, keepdim=True), lambda a: a.sum(0, keepdims=True)),
    "cumprod": (lambda t: t.cumprod(0), lambda a: a.cumprod(0)),
    "cummax": (lambda t: t.cummax(0)[0], lambda a: np.maximum.accumulate(a, 0)),
    "layernorm": (lambda t: t.layernorm(-1), lambda a: a),
    "rmsnorm": (lambda t: t.rmsnorm(-1), lambda a: a),
    "cross_entropy": (lambda t: t.cross_entropy(t.argmax(1), reduction="none"), lambda a: a.sum(1)),
    "reshape": (lambda t: t.reshape(3, 0).contiguous(), lambda a: a.reshape(3, 0)),
    "shrink": (lambda t: t[:, 1:].contiguous(), lambda a: a[:, 1:]),
    "shrink_to_empty": (lambda t: t[:, 3:].contiguous(), lambda a: a[:, 3:]),
    "transpose": (lambda t: t.transpose(0, 1).contiguous(), lambda a: a.T),
    "repeat": (lambda t: t.repeat(2, 1), lambda a: np.tile(a, (2, 1))),
    "unsqueeze": (lambda t: t.unsqueeze(0).contiguous(), lambda a: a[None]),
    "roll": (lambda t: t.roll(1, 1), lambda a: np.roll(a, 1, 1)),
    "stack": (lambda t: t.stack(t), lambda a: np.stack([a, a])),
    "gather": (lambda t: t.gather(1, t.argmax(1, keepdim=True)), lambda a: a[:, :1]),
    "sort": (lambda t: t.sort(1)[0], lambda a: np.sort(a, 1)),
}


@pytest.mark.parametrize("name", sorted(EMPTY_CASES))
def test_zero_size_inputs_give_numpys_result_without_empty_launches(device: str, name: str, monkeypatch) -> None:
    launched: list[str] = []
    real = lazygrad.engine.CompiledRunner.__call__

    def counting(self, bufs, *args, **kwargs):
        launched.append(self.spec.name)
        assert all(b.size for b in bufs[: len(self.spec.outs)]), f"{self.spec.name} launched to write nothing"
        return real(self, bufs, *args, **kwargs)

    monkeypatch.setattr(lazygrad.engine.CompiledRunner, "__call__", counting)
    build, ref = EMPTY_CASES[name]
    a = np.zeros((0, 3), np.float32)
    out = build(Tensor(a, device=device)).realize()
    want = ref(a)
    np.testing.assert_array_equal(out.numpy(), want)
    if want.size == 0:
        assert not launched, f"kernels launched for an empty result: {launched}"


def test_a_max_over_an_empty_axis_says_so(device: str) -> None:
    # (numpy and torch raise too: a max of no elements has no value)
    with pytest.raises(Exception, match="empty dimension"):
        Tensor(np.zeros((0, 3), np.float32), device=device).max(0).realize()


def test_eye_of_zero(device: str) -> None:
    assert Tensor.eye(0, device=device).realize().numpy().shape == (0, 0)
    np.testing.assert_array_equal(Tensor.eye(0, 3, device=device).numpy(), np.eye(0, 3))


# *** reductions across the contiguous axis, and over axes around an output axis, on a GPU ***

# (shape, reduced axes, cut along an axis by `axis_split` on the emulated GPU's 32 compute units): columns (the
# last axis kept), BatchNorm statistics of NCHW tensors (N, H, W around C), with and without a cut
STRIDED = [
    ((256, 130), (0,), True),
    ((264, 129), (0,), True),
    ((4, 96, 100), (0, 1), True),
    ((130, 300, 2), (1,), True),
    ((64, 2, 24, 24), (0, 2, 3), True),
    ((12, 5, 7, 7), (0, 2, 3), False),
    ((6, 3, 5, 40), (0, 2), False),
]


@pytest.mark.parametrize("emulated_gpu", [32], ids=["shuffles"], indirect=True)
@settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=hst.sampled_from(STRIDED),
    op=hst.sampled_from(["sum", "max", "min", "mean", "argmax"]),
    dtype=hst.sampled_from([dtypes.float32, dtypes.int32, dtypes.float16]),
)
def test_strided_reductions_on_an_emulated_gpu_match_numpy(emulated_gpu: str, case, op: str, dtype) -> None:
    shape, axes, cut = case
    a = own_values(shape, dtype)
    t = Tensor(a, device=emulated_gpu, dtype=dtype)
    if op == "argmax":
        # one axis only: the first reduced one
        got, want = t.argmax(axes[0]), a.argmax(axes[0])
    else:
        got = getattr(t, op)(axes)
        want = a.astype(np.float64).mean(axes) if op == "mean" else getattr(a.astype(np.float64), op)(axes)
    reductions = [si for si in got.schedule() if any(u.op is Ops.REDUCE_AXIS for u in si.ast.toposort)]
    if cut and op != "argmax":
        assert len(reductions) >= 2, "partial reductions along the cut axis and their reduction"
    tol = 2e-2 if dtype == dtypes.float16 else 1e-5
    np.testing.assert_allclose(np.asarray(got.numpy(), np.float64), want, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("case", STRIDED, ids=lambda c: f"{c[0]}-{c[1]}")
def test_strided_reductions_match_numpy_on_every_device(device: str, case) -> None:
    # the same reductions on each device with its own choices (cut along an axis on GPUs, whole or flat elsewhere)
    shape, axes, _ = case
    if device == "CL" and case is not STRIDED[0]:
        pytest.skip("PoCL takes seconds per kernel: CL runs the first case (the emulated GPU runs every one above)")
    if device == "PYTHON" and np.prod(shape) > 40000:
        pytest.skip("the PYTHON interpreter takes seconds on the larger cases (the emulated GPU runs them above)")
    a = own_values(shape, dtypes.float32)
    t = Tensor(a, device=device)
    np.testing.assert_allclose(t.sum(axes).numpy(), a.astype(np.float64).sum(axes), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(t.max(axes).numpy(), a.max(axes))
    np.testing.assert_allclose(t.mean(axes).numpy(), a.astype(np.float64).mean(axes), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("emulated_gpu", [32], ids=["shuffles"], indirect=True)
@pytest.mark.parametrize("shape", [(256, 130), (64, 2, 24, 24)])
def test_gradient_sums_of_broadcasts_are_cut_on_an_emulated_gpu_and_match_torch(emulated_gpu: str, shape) -> None:
    # the weight's gradient of x * w (w broadcast over every axis but 1, or but the last): a column sum, or a
    # BatchNorm-like sum over (N, H, W), built by the gradient as reductions of its own
    torch = pytest.importorskip("torch")
    keep = 1 if len(shape) == 4 else len(shape) - 1
    wshape = tuple(d if i == keep else 1 for i, d in enumerate(shape))
    a, b = own_values(shape, dtypes.float32), own_values(wshape, dtypes.float32)
    x, w = Tensor(a, device=emulated_gpu), Tensor(b, device=emulated_gpu, requires_grad=True)
    (x * w).sum().backward()
    reductions = [si for si in w.grad.schedule() if any(u.op is Ops.REDUCE_AXIS for u in si.ast.toposort)]
    assert len(reductions) >= 2, "partial sums along the cut axis and their sum"
    tw = torch.tensor(b, requires_grad=True)
    (torch.tensor(a) * tw).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("emulated_gpu", [32], ids=["shuffles"], indirect=True)
@settings(deadline=None, max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    k=hst.sampled_from([96, 200, 384, 515]),
    m=hst.sampled_from([64, 130, 256]),
    lead=hst.sampled_from([(), (1,), (1, 1)]),
    dtype=hst.sampled_from([dtypes.float32, dtypes.float16]),
)
def test_row_times_matrix_is_cut_like_a_column_reduction_on_an_emulated_gpu(
    emulated_gpu: str, k: int, m: int, lead: tuple[int, ...], dtype
) -> None:
    # a decoding step's x @ W (one row of x, W stored (k, m)): the rows of W cut into parts, each summed by
    # coalesced threads, then the parts, rather than a workgroup per few columns reading all k rows alone
    x, w = own_values((*lead, k), dtype), own_values((k, m), dtype)
    got = Tensor(x, device=emulated_gpu) @ Tensor(w, device=emulated_gpu)
    reductions = [si for si in got.schedule() if any(u.op is Ops.REDUCE_AXIS for u in si.ast.toposort)]
    if k * m >= PARALLEL_MIN and k > COLUMN_PART_ROWS:  # else too small to be worth a cut
        assert len(reductions) >= 2, "partial sums of row blocks and their sum"
    want = x.astype(np.float64) @ w.astype(np.float64)
    tol = 2e-2 if dtype == dtypes.float16 else 1e-5
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got.numpy(), np.float64), want, rtol=tol, atol=tol * np.sqrt(k))


def test_row_times_matrix_gradients_match_torch_on_every_device(device: str) -> None:
    torch = pytest.importorskip("torch")
    x, w = own_values((1, 300), dtypes.float32), own_values((300, 70), dtypes.float32)
    tx, tw = Tensor(x, device=device, requires_grad=True), Tensor(w, device=device, requires_grad=True)
    (tx @ tw).square().sum().backward()
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (rx @ rw).square().sum().backward()
    for got, want in ((tx.grad, rx.grad), (tw.grad, rw.grad)):
        want = want.numpy()  # sums of products of values up to a few hundred: tolerances on that scale
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
