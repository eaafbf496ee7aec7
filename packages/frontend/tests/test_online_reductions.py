"""Online reductions (`lazygrad_codegen.online_reductions`): the row's max and its sum of exponentials, or its sum
and squared deviations from the mean, computed in one loop, so softmax, log_softmax, cross-entropy and layernorm
forward read each row at most twice (counted from the programs' global loads); values against torch (and float64
numpy for the variance's accuracy) for special rows (-inf, +inf, large values, rows far from zero), odd widths and
fp16/bf16/fp32, on CPU, PYTHON, CL and the PYTHON device emulating a GPU (warp shuffles, or local memory only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazygrad import Tensor
from lazygrad_codegen import get_program
from lazygrad_codegen.memory_traffic import global_load_bytes
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(5)
INF = np.inf


def _reads_rows(u: UOp, numel: int) -> bool:
    """Whether `u` is a load from a global buffer of `numel` elements (a whole input, not a value per row)."""
    if u.op is not Ops.LOAD or u.src[0].op is not Ops.INDEX or u.src[0].src[0].op is not Ops.DEFINE_GLOBAL:
        return True  # not a global load: kept (loops, other ops)
    return u.src[0].src[0].dtype.size == numel


def row_reads(t: Tensor, rows: int, width: int, itemsize: int = 4) -> list[float]:
    """How often each kernel of `t`'s schedule reads the (rows, width) inputs: the bytes its programs load from
    buffers of that size, in units of one such input (loads of values per row left out; layernorm's first element of
    each row, its shift, adds 1/width)."""
    out = []
    for si in t.schedule():
        if si.ast.op is not Ops.SINK:
            continue
        spec = get_program(si.ast, Device[t.device].renderer)
        uops = [u for u in spec.uops if _reads_rows(u, rows * width)]
        out.append(global_load_bytes(uops, spec.global_size, spec.local_size) / (rows * width * itemsize))
    return out


OPS = {
    "softmax": lambda t: t.softmax(-1),
    "log_softmax": lambda t: t.log_softmax(-1),
}
TORCH = {"softmax": lambda r: r.softmax(-1), "log_softmax": lambda r: r.log_softmax(-1)}
READ_TWICE = {**OPS, "layernorm": lambda t: t.layernorm(-1)}


# *** reads ***


@pytest.mark.parametrize("name", sorted(READ_TWICE))
def test_forward_reads_each_row_twice_on_the_cpu(name: str) -> None:
    rows, width = 16, 4096
    reads = row_reads(READ_TWICE[name](Tensor.empty(rows, width)), rows, width)
    assert len(reads) == 2 and reads == pytest.approx([1.0, 1.0], abs=1e-3), reads


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
@pytest.mark.parametrize("name", sorted(READ_TWICE))
def test_forward_reads_each_row_twice_on_an_emulated_gpu(emulated_gpu: str, name: str) -> None:
    rows, width = 40, 2048
    reads = row_reads(READ_TWICE[name](Tensor.empty(rows, width, device=emulated_gpu)), rows, width)
    # (layernorm's shift: each of a row's 256 threads reads the row's first element, one address, cached)
    threads = 256 if name == "layernorm" else 0
    assert reads == pytest.approx([1.0, 1.0], abs=threads / width + 1e-9), reads


def test_the_cpu_rescales_its_sums_once_per_step() -> None:
    """softmax's loop on the CPU keeps one vector of sums per row and rescales it once per step of several vectors:
    one exp2 per vector of elements plus one, not two per vector (exp2 is most of its time)."""
    x = Tensor(RNG.standard_normal((8, 4096)).astype(np.float32))
    kernel = next(si for si in x.softmax(-1).schedule() if si.ast.op is Ops.SINK)
    spec = get_program(kernel.ast, Device["CPU"].renderer)
    depth, exps, loads = 0, 0, 0
    for u in spec.uops:
        depth += (u.op is Ops.RANGE) - (u.op is Ops.END)
        if depth and u.op is Ops.EXP2:
            exps += 1
        if depth and u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.dtype.count > 1:
            loads += 1
    assert loads > 1 and exps == loads + 1, (exps, loads)
    torch_out = torch.tensor(x.numpy()).softmax(-1).numpy()
    np.testing.assert_allclose(x.softmax(-1).numpy(), torch_out, rtol=1e-6, atol=1e-7)


def test_cross_entropy_forward_reads_the_logits_at_most_twice() -> None:
    rows, width = 16, 4096
    labels = Tensor(np.arange(rows, dtype=np.int32) * 7 % width)
    loss = Tensor.empty(rows, width).cross_entropy(labels, reduction="none")
    assert sum(row_reads(loss, rows, width)) <= 2.0


def test_softmax_backward_reads_the_row_and_its_gradient_twice() -> None:
    # the gradient's first kernel recomputes the max and the sum and sums g * softmax in the same loop (a weighted
    # sum rescaled with the sum): x and g once each there, and once each in the output kernel
    rows, width = 16, 4096
    x = Tensor.empty(rows, width, requires_grad=True)
    x.softmax(-1).backward(Tensor.empty(rows, width))
    reads = row_reads(x.grad, rows, width)
    assert reads == pytest.approx([2.0, 2.0]), reads


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
def test_softmax_backward_reads_twice_on_an_emulated_gpu(emulated_gpu: str) -> None:
    rows, width = 40, 2048
    x = Tensor.empty(rows, width, device=emulated_gpu, requires_grad=True)
    x.softmax(-1).backward(Tensor.empty(rows, width, device=emulated_gpu))
    assert row_reads(x.grad, rows, width) == pytest.approx([2.0, 2.0]), "x and g once each per kernel"


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
def test_layernorm_backward_reads_twice_on_an_emulated_gpu(emulated_gpu: str) -> None:
    # the gradient's sums of g and g * (x - mean) join the mean and variance's loop (sums of g and g * (x - K) kept
    # beside them): x and g once each in each of the two kernels
    rows, width = 40, 2048
    x = Tensor.empty(rows, width, device=emulated_gpu, requires_grad=True)
    x.layernorm(-1).backward(Tensor.empty(rows, width, device=emulated_gpu))
    assert row_reads(x.grad, rows, width) == pytest.approx([2.0, 2.0], abs=256 / width), "x and g once per kernel"


def test_layernorm_backward_reads_twice_on_the_cpu() -> None:
    rows, width = 16, 4096
    x = Tensor.empty(rows, width, requires_grad=True)
    x.layernorm(-1).backward(Tensor.empty(rows, width))
    assert row_reads(x.grad, rows, width) == pytest.approx([2.0, 2.0], abs=1e-3)


@pytest.mark.parametrize("width", [1, 7, 100, 1000, 4097])
def test_layernorm_backward_matches_float64(width: int) -> None:
    a = layernorm_rows(width)[[0, 1, 2, 4]]  # (a constant row's gradient is eps-dominated, in torch too)
    g = RNG.standard_normal(a.shape).astype(np.float32)
    x = Tensor(a, requires_grad=True)
    x.layernorm(-1).backward(Tensor(g))
    r = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.layer_norm(r, (width,)).backward(torch.tensor(g, dtype=torch.float64))
    t32 = torch.tensor(a, requires_grad=True)
    torch.nn.functional.layer_norm(t32, (width,)).backward(torch.tensor(g))
    ref = r.grad.numpy()
    assert np.abs(x.grad.numpy() - ref).max() <= 5 * np.abs(t32.grad.numpy() - ref).max() + 5e-5


def skip_unless_usable(device: str) -> None:
    if (why := Device.usable(device) if device in Device.installed() else "not installed") is not None:
        pytest.skip(f"{device} unavailable: {why}")


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "CL"])
@pytest.mark.parametrize("width", [1, 7, 300])
def test_softmax_backward_of_special_rows_matches_torch(device: str, width: int) -> None:
    skip_unless_usable(device)
    if device != "CPU" and width > 7:
        pytest.skip("the CPU runs the wide rows")
    a = special_rows(width)[1:]  # (a row of -inf only has NaN gradients in both)
    g = RNG.standard_normal(a.shape).astype(np.float32)
    x = Tensor(a, device=device, requires_grad=True)
    x.softmax(-1).backward(Tensor(g, device=device))
    r = torch.tensor(a, requires_grad=True)
    r.softmax(-1).backward(torch.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-6, equal_nan=True)


# *** values ***


def special_rows(width: int) -> np.ndarray:
    a = (RNG.standard_normal((6, width)) * 3).astype(np.float32)
    a[0, :] = -INF  # every element -inf: NaN, as torch
    a[1, : max(width - 1, 1)] = -INF  # -inf before the max: they add 0
    a[2, :] = 1000.0
    a[2, -1] = 1001.0  # large values
    a[3, ::3] = -INF
    a[4, width // 2] = 80.0  # a max far above the rest, in the middle of the row
    return a


def check(device: str, name: str, a: np.ndarray, dtype: str = "float32", rtol: float = 2e-5) -> None:
    ours = OPS[name](Tensor(a, device=device).cast(dtype)).float().numpy()
    ref = TORCH[name](torch.tensor(a).to(getattr(torch, dtype)).float()).numpy()
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=rtol, equal_nan=True, err_msg=f"{name} {dtype} {device}")


@pytest.mark.parametrize("width", [1, 2, 3, 31, 257, 1000, 4099, 65536])
@pytest.mark.parametrize("name", sorted(OPS))
def test_special_rows_match_torch_on_the_cpu(name: str, width: int) -> None:
    check("CPU", name, special_rows(width))


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
@pytest.mark.parametrize("width", [1, 33, 1030])
def test_special_rows_match_torch_on_an_emulated_gpu(emulated_gpu: str, width: int) -> None:
    # 40 rows: a workgroup per row (combining (max, sum) pairs across warps and threads)
    a = np.concatenate([special_rows(width)] * 7)[:40]
    for name in OPS:
        check(emulated_gpu, name, a)


@pytest.mark.parametrize("device", ["PYTHON", "CL"])
def test_special_rows_match_torch_on_other_devices(device: str) -> None:
    skip_unless_usable(device)
    for name in OPS:
        check(device, name, special_rows(37))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_half_precision_rows_match_torch(device: str, dtype: str) -> None:
    # torch computes in the input's precision too, rounding differently: a tolerance of a few of its ulps
    a = (RNG.standard_normal((4, 300)) * 3).astype(np.float32)
    tol = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 2e-5}[dtype]
    for name in OPS:
        check(device, name, a, dtype, rtol=tol)


@settings(max_examples=25, deadline=None)
@given(
    width=st.integers(1, 300),
    infs=st.lists(st.integers(0, 299), max_size=20),
    scale=st.sampled_from([1.0, 30.0, 1000.0]),
)
def test_random_rows_with_infinities_match_torch(width: int, infs: list[int], scale: float) -> None:
    a = (RNG.standard_normal((3, width)) * scale).astype(np.float32)
    for i in infs:
        a[i % 3, i % width] = -INF
    for name in OPS:
        check("CPU", name, a, rtol=1e-4)


def test_a_sum_over_another_max_keeps_its_own_loop_and_matches_numpy() -> None:
    # exp(x - max(y)): the max of another tensor is not the pair's shift, so the sum keeps the nested loops
    a = RNG.standard_normal((5, 64)).astype(np.float32)
    b = RNG.standard_normal((5, 64)).astype(np.float32)
    x, y = Tensor(a), Tensor(b)
    out = (x - y.max(-1, keepdim=True)).exp().sum(-1)
    np.testing.assert_allclose(out.numpy(), np.exp(a - b.max(-1, keepdims=True)).sum(-1), rtol=1e-5)


def test_the_pair_is_found_in_softmax_and_not_in_a_negative_exponent() -> None:
    from lazygrad_codegen.kernel import Kernel
    from lazygrad_codegen.online_reductions import find_online

    renderer = Device["CPU"].renderer

    def pairs(t: Tensor) -> int:
        si = next(
            si for si in t.schedule() if si.ast.op is Ops.SINK and any(u.op is Ops.REDUCE_AXIS for u in si.ast.toposort)
        )
        return len(find_online(Kernel(si.ast, renderer)))

    x = Tensor.empty(8, 64)
    assert pairs(x.softmax(-1)) == 2
    # exp(-(x - max)): rescaling by a growing max would overflow; left nested
    m = x.max(-1, keepdim=True)
    assert pairs((-(x - m)).exp().sum(-1)) == 0
    assert dtypes.float32 == x.dtype


# *** layernorm and variance ***


def layernorm_rows(width: int) -> np.ndarray:
    # (drawn from a generator of their own: the same rows whatever ran before)
    a = (np.random.default_rng(width).standard_normal((6, width)) * 3).astype(np.float32)
    a[1] += 1e4  # far from zero: the sum of squares minus the squared sum would lose every digit
    a[2, 0] = 300.0  # a first element far out of the row (the shift of the deviations)
    a[3] = 7.0  # constant: variance 0
    a[4] *= 1e-3
    return a


def layernorm_error(device: str, a: np.ndarray) -> float:
    ours = Tensor(a, device=device).layernorm(-1).numpy()
    ref = torch.nn.functional.layer_norm(torch.tensor(a, dtype=torch.float64), a.shape[-1:]).numpy()
    return float(np.abs(ours - ref).max())


@pytest.mark.parametrize("width", [1, 2, 7, 100, 1000, 4097, 65536])
def test_layernorm_is_about_as_accurate_as_torch_on_the_cpu(width: int) -> None:
    a = layernorm_rows(width)
    theirs = torch.nn.functional.layer_norm(torch.tensor(a), a.shape[-1:]).numpy()
    ref = torch.nn.functional.layer_norm(torch.tensor(a, dtype=torch.float64), a.shape[-1:]).numpy()
    # rows far from zero are off by the rounding of their mean in float32 (torch's too): within a few times torch's
    # own error on these rows; the sum of squares minus the squared sum would be off by whole units on row 1
    assert layernorm_error("CPU", a) <= 5 * float(np.abs(theirs - ref).max()) + 5e-5


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
@pytest.mark.parametrize("width", [1, 33, 1030])
def test_layernorm_rows_on_an_emulated_gpu_match_float64(emulated_gpu: str, width: int) -> None:
    # (not the constant row: its output is the rounding of its mean times 1 / sqrt(eps), a few 1e-4, as before)
    a = np.concatenate([np.delete(layernorm_rows(width), 3, axis=0)] * 8)[:40]
    assert layernorm_error(emulated_gpu, a) <= 3e-4


@pytest.mark.parametrize("device", ["PYTHON", "CL"])
def test_layernorm_rows_on_other_devices_match_float64(device: str) -> None:
    skip_unless_usable(device)
    assert layernorm_error(device, np.delete(layernorm_rows(37), 3, axis=0)) <= 3e-4


def test_layernorm_of_infinite_rows_is_nan_as_torch() -> None:
    a = RNG.standard_normal((3, 9)).astype(np.float32)
    a[0, 0] = np.inf  # the shift itself
    a[1, 4] = -np.inf
    a[2, 2] = np.nan
    ours = Tensor(a).layernorm(-1).numpy()
    ref = torch.nn.functional.layer_norm(torch.tensor(a), (9,)).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_layernorm_matches_torch(dtype: str) -> None:
    a = (RNG.standard_normal((4, 300)) * 3 + 5).astype(np.float32)
    ours = Tensor(a).cast(dtype).layernorm(-1).float().numpy()
    ref = torch.nn.functional.layer_norm(torch.tensor(a).to(getattr(torch, dtype)).float(), (300,)).numpy()
    # computed in the input's precision (torch upcasts to float32 inside): two of its ulps (2^-10, 2^-7 relative)
    ulp = {"float16": 2**-10, "bfloat16": 2**-7}[dtype]
    np.testing.assert_allclose(ours, ref, rtol=2 * ulp, atol=2 * ulp)
