"""Row reductions in few kernels (`lazygrad_scheduler.row_values`): softmax, log_softmax, layernorm and RMS norm
forward in two kernels (the row's reductions, one loop after the other, then the elementwise output), their backward
likewise; values against torch for widths from 1 to 65,536, odd ones included, forward and backward, on CPU, PYTHON
and CL, and on the PYTHON device pretending to be a GPU (a workgroup per row: local memory, barriers and warp
shuffles, emulated)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(11)

FORWARD: dict[str, tuple[Callable, Callable]] = {
    "softmax": (lambda t: t.softmax(-1), lambda r: r.softmax(-1)),
    "log_softmax": (lambda t: t.log_softmax(-1), lambda r: r.log_softmax(-1)),
    "layernorm": (lambda t: t.layernorm(-1), lambda r: torch.nn.functional.layer_norm(r, r.shape[-1:])),
    "rmsnorm": (lambda t: t.rmsnorm(-1), lambda r: torch.nn.functional.rms_norm(r, r.shape[-1:], eps=1e-6)),
}


def kernels(*ts: Tensor) -> list:
    return [si for si in ts[0].schedule(*ts[1:]) if si.ast.op is Ops.SINK]


def reductions(si) -> list:
    return [u for u in si.ast.toposort if u.op is Ops.REDUCE_AXIS]


# *** kernel counts ***


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_is_two_kernels_with_the_reductions_in_the_first(name: str) -> None:
    x = Tensor(RNG.standard_normal((64, 1000)).astype(np.float32))
    ks = kernels(FORWARD[name][0](x))
    assert len(ks) <= 2, [k.ast for k in ks]
    assert not reductions(ks[-1]), "the last kernel writes the rows elementwise"
    # every reduction over the row sits in the first kernel, later ones reading earlier ones (nested)
    reds = reductions(ks[0])
    assert len(reds) >= 1 and all(r.arg[1] == reds[0].arg[1] for r in reds)
    if name != "rmsnorm":
        assert any(r in q.src[0].toposort for r in reds for q in reds if q is not r), "no reduction reads another"


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_backward_adds_no_kernels_beyond_two(name: str) -> None:
    x = Tensor(RNG.standard_normal((64, 1000)).astype(np.float32), requires_grad=True)
    g = Tensor(RNG.standard_normal((64, 1000)).astype(np.float32))
    FORWARD[name][0](x).backward(g)
    ks = kernels(x.grad)
    # the gradient in two kernels (the forward's reductions join the backward's in the first; log_softmax's sum of
    # the incoming gradient g joins them too, as the gradient's kernel reads both)
    assert len(ks) <= 2, [reductions(k) for k in ks]
    assert sum(1 for k in ks if not reductions(k)) == 1


def test_a_read_that_is_not_a_broadcast_of_the_row_keeps_its_own_kernel() -> None:
    # the row max read flipped along the batch axis: not the same row's value, so it can't be computed in the loop
    a = RNG.standard_normal((6, 50)).astype(np.float32)
    x = Tensor(a)
    m = x.max(-1, keepdim=True)
    out = (x - m.flip(0)).exp().sum(-1)
    assert len(kernels(out)) == 2
    want = np.exp(a - a.max(-1, keepdims=True)[::-1]).sum(-1)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)


def test_nested_reductions_over_two_axes_match_numpy() -> None:
    # a variance over the last two axes: the mean's loops, then the squares' loops, in one kernel
    a = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    x = Tensor(a)
    out = ((x - x.mean((1, 2), keepdim=True)).square()).sum((1, 2))
    assert len(kernels(out)) == 1
    np.testing.assert_allclose(out.numpy(), ((a - a.mean((1, 2), keepdims=True)) ** 2).sum((1, 2)), rtol=1e-5)


# *** values ***

WIDTHS = [1, 2, 7, 33, 100, 257, 1000, 1024, 4097, 65536]
# the widest rows each device runs here in reasonable time (the CPU runs them all)
WIDEST = {"PYTHON": 257, "CL": 4097}
CL_WIDTHS = (7, 257, 4097)


def check_against_torch(device: str, name: str, rows: int, width: int, backward: bool = True) -> None:
    a = (RNG.standard_normal((rows, width)) * 3).astype(np.float32)
    gv = RNG.standard_normal((rows, width)).astype(np.float32)
    ours, theirs = FORWARD[name]
    x = Tensor(a, device=device, requires_grad=True)
    y = ours(x)
    r = torch.tensor(a, requires_grad=True)
    want = theirs(r)
    np.testing.assert_allclose(y.numpy(), want.detach().numpy(), rtol=2e-4, atol=2e-5, err_msg=f"{name} forward")
    if backward:
        y.backward(Tensor(gv, device=device))
        want.backward(torch.tensor(gv))
        np.testing.assert_allclose(x.grad.numpy(), r.grad.numpy(), rtol=2e-3, atol=2e-4, err_msg=f"{name} backward")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", sorted(FORWARD))
def test_row_kernels_match_torch(device: str, name: str, width: int) -> None:
    if width > WIDEST.get(device, width):
        pytest.skip(f"{device} takes seconds on rows this wide (the CPU runs them)")
    if device == "CL" and width not in CL_WIDTHS:
        pytest.skip(f"PoCL compiles each kernel for seconds: CL runs widths {CL_WIDTHS}, the CPU all of them")
    check_against_torch(device, name, 5, width, backward=device != "PYTHON" or width <= 33)


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
@pytest.mark.parametrize("width", [1, 31, 100, 1024, 2050])
@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_row_kernels_on_an_emulated_gpu_match_torch(emulated_gpu: str, name: str, width: int) -> None:
    # 40 rows: enough outputs that the rows are not split into partial reductions, a workgroup per row
    x = Tensor.empty(40, width, device=emulated_gpu)
    (fused, *_) = kernels(FORWARD[name][0](x))
    if width >= 1024:
        from lazygrad_codegen import get_program

        spec = get_program(fused.ast, Device[emulated_gpu].renderer)
        assert spec.global_size[0] * spec.global_size[1] * spec.global_size[2] == 40
        assert spec.local_size[0] > 1, "a workgroup of threads per row"
    check_against_torch(emulated_gpu, name, 40, width, backward=width <= 100)
