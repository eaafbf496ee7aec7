"""Cross-entropy (with class indices or probabilities, label smoothing, ignored labels), nll_loss of log_softmax,
log_softmax's backward, RMS norm and mean/var over the last axis: forward and backward each in at most two kernels
that read the rows, each kernel reading each row-sized buffer (the input, the incoming gradient, a target of
probabilities) at most once, counted from the programs' global loads on the CPU and on the PYTHON device emulating a
GPU; values against torch for widths 1 to 65,536 and odd row counts, forward and backward."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad_codegen import get_program
from lazygrad_codegen.memory_traffic import global_load_bytes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _global_of(u: UOp) -> UOp | None:
    """The global buffer a LOAD reads, else None."""
    if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL:
        return u.src[0].src[0]
    return None


def row_buffer_reads(t: Tensor, numel: int) -> list[dict[int, float]]:
    """For each kernel of `t`'s schedule, how many times it reads each of its buffers of `numel` elements (the rows,
    not values per row), by buffer: the bytes its program loads from that buffer over the buffer's size."""
    out = []
    for si in t.schedule():
        if si.ast.op is not Ops.SINK:
            continue
        spec = get_program(si.ast, Device[t.device].renderer)
        rows = {g for u in spec.uops if (g := _global_of(u)) is not None and g.dtype.size == numel}
        reads = {}
        for g in rows:
            uops = [u for u in spec.uops if _global_of(u) in (None, g)]
            size = numel * g.dtype.base.itemsize
            reads[g.arg] = global_load_bytes(uops, spec.global_size, spec.local_size) / size
        out.append(reads)
    return out


def labels_for(rows: int, width: int, device: str) -> Tensor:
    return Tensor(np.arange(rows, dtype=np.int32) * 7 % width, device=device)


def grad(loss: Callable[[Tensor], Tensor], rows: int, width: int, device: str) -> Tensor:
    """The gradient of `loss` at an input of (rows, width), fed an incoming gradient of the loss's shape."""
    x = Tensor.empty(rows, width, device=device, requires_grad=True)
    out = loss(x)
    out.backward(Tensor.empty(*out.shape, device=device) if out.ndim else None)
    return x.grad


def _cases(rows: int, width: int, device: str) -> dict[str, tuple[Callable[[], Tensor], int]]:
    """name -> (the tensor to schedule, the most kernels it may take)."""

    def labels() -> Tensor:
        return labels_for(rows, width, device)

    def probs() -> Tensor:
        return Tensor.empty(rows, width, device=device)

    def x() -> Tensor:
        return Tensor.empty(rows, width, device=device)

    def g(f: Callable[[Tensor], Tensor]) -> Callable[[], Tensor]:
        return lambda: grad(f, rows, width, device)

    # the row kernel, then the output (an elementwise gradient, or the mean over the rows); sparse cross-entropy and
    # nll_loss with ignored labels also count the labels kept, a kernel over the labels alone
    return {
        "log_softmax backward": (g(lambda t: t.log_softmax(-1)), 2),
        "cross_entropy forward": (lambda: x().cross_entropy(labels()), 2),
        "cross_entropy backward": (g(lambda t: t.cross_entropy(labels())), 2),
        "cross_entropy none backward": (g(lambda t: t.cross_entropy(labels(), reduction="none")), 2),
        "cross_entropy sum smoothed backward": (
            g(lambda t: t.cross_entropy(labels(), reduction="sum", label_smoothing=0.1)),
            2,
        ),
        "cross_entropy probabilities backward": (g(lambda t: t.cross_entropy(probs())), 2),
        "sparse_categorical_crossentropy backward": (g(lambda t: t.sparse_categorical_crossentropy(labels())), 3),
        "sparse_categorical_crossentropy ignored smoothed backward": (
            g(lambda t: t.sparse_categorical_crossentropy(labels(), ignore_index=3, label_smoothing=0.2)),
            3,
        ),
        "nll_loss of log_softmax backward": (g(lambda t: t.log_softmax(-1).nll_loss(labels())), 2),
        "nll_loss ignored backward": (g(lambda t: t.log_softmax(-1).nll_loss(labels(), ignore_index=3)), 3),
        "rmsnorm forward": (lambda: x().rmsnorm(-1), 2),
        "rmsnorm backward": (g(lambda t: t.rmsnorm(-1)), 2),
        "mean forward": (lambda: x().mean(-1), 1),
        "mean backward": (g(lambda t: t.mean(-1)), 1),
        "var forward": (lambda: x().var(-1), 1),
        "var backward": (g(lambda t: t.var(-1)), 2),
    }


NAMES = sorted(_cases(1, 1, "CPU"))


def check_reads(device: str, name: str, rows: int, width: int, slack: float = 0.0) -> None:
    build, most = _cases(rows, width, device)[name]
    reads = row_buffer_reads(build(), rows * width)
    assert len(reads) <= most, reads
    assert sum(1 for r in reads if r) <= 2, f"kernels reading the rows: {reads}"
    # no row-sized buffer read more than twice in all (`slack`: a row's first element, the variance's shift, read by
    # every thread of its workgroup)
    for buf in {b for r in reads for b in r}:
        assert sum(r.get(buf, 0) for r in reads) <= 2 + slack, reads


@pytest.mark.parametrize("name", NAMES)
def test_each_row_is_read_at_most_once_per_kernel_in_two_kernels_on_the_cpu(name: str) -> None:
    check_reads("CPU", name, 16, 4096)


@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
@pytest.mark.parametrize("name", NAMES)
def test_each_row_is_read_at_most_once_per_kernel_in_two_kernels_on_an_emulated_gpu(
    emulated_gpu: str, name: str
) -> None:
    check_reads(emulated_gpu, name, 40, 2048, slack=256 / 2048)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_forward_reads_the_logits_once(smoothing: float) -> None:
    # the loss's sum of the target times log_softmax (x - max - log(sum)) joins the max and sum of exponentials' loop:
    # a sum of the target times x - max kept as the max grows (`online_reductions`), so a training step, which adds
    # the gradient's kernel, reads the logits twice in all
    rows, width = 16, 4096
    loss = Tensor.empty(rows, width).cross_entropy(labels_for(rows, width, "CPU"), label_smoothing=smoothing)
    reads = row_buffer_reads(loss, rows * width)
    assert sum(sum(r.values()) for r in reads) == pytest.approx(1.0), reads
    x = Tensor.empty(rows, width, requires_grad=True)
    loss = x.cross_entropy(labels_for(rows, width, "CPU"), label_smoothing=smoothing)
    loss.backward()
    step = [si for si in loss.schedule(x.grad) if si.ast.op is Ops.SINK]
    renderer = Device["CPU"].renderer
    total = 0.0
    for si in step:
        spec = get_program(si.ast, renderer)
        logits = [g for u in spec.uops if (g := _global_of(u)) is not None and g.dtype.size == rows * width]
        uops = [u for u in spec.uops if _global_of(u) is None or _global_of(u) in logits]
        total += global_load_bytes(uops, spec.global_size, spec.local_size) / (rows * width * 4)
    assert total == pytest.approx(2.0), "the loss's loop and the gradient's kernel"


def test_log_softmax_backward_reads_the_input_and_its_gradient_in_one_loop() -> None:
    # the sum of the incoming gradient joins the max and the sum of exponentials (a kernel that reads both): one loop
    rows, width = 16, 4096
    x = Tensor.empty(rows, width, requires_grad=True)
    x.log_softmax(-1).backward(Tensor.empty(rows, width))
    first = next(si for si in x.grad.schedule() if si.ast.op is Ops.SINK)
    spec = get_program(first.ast, Device["CPU"].renderer)
    assert sum(1 for u in spec.uops if u.op is Ops.RANGE) == 1, "one loop over the row"
    assert sorted(row_buffer_reads(x.grad, rows * width)[0].values()) == pytest.approx([1.0, 1.0]), "x and g once"


# *** values ***

WIDTHS = [1, 2, 3, 31, 257, 1000, 4097, 65536]


def _data(rows: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    labels = rng.integers(0, width, rows).astype(np.int32)
    labels[1 % rows] = 0
    p = rng.random((rows, width)).astype(np.float32)
    return a, labels, p / p.sum(-1, keepdims=True), rng.standard_normal((rows, width)).astype(np.float32)


def losses(labels: np.ndarray, p: np.ndarray, ignore: int, device: str) -> dict[str, tuple[Callable, Callable]]:
    """name -> (our loss of a Tensor, torch's of a torch tensor)."""
    y, yt = Tensor(labels, device=device), torch.tensor(labels, dtype=torch.int64)
    pr, pt = Tensor(p, device=device), torch.tensor(p)
    return {
        "cross_entropy": (lambda t: t.cross_entropy(y), lambda r: F.cross_entropy(r, yt)),
        "cross_entropy none": (
            lambda t: t.cross_entropy(y, reduction="none"),
            lambda r: F.cross_entropy(r, yt, reduction="none"),
        ),
        "cross_entropy smoothed sum": (
            lambda t: t.cross_entropy(y, reduction="sum", label_smoothing=0.1),
            lambda r: F.cross_entropy(r, yt, reduction="sum", label_smoothing=0.1),
        ),
        "cross_entropy probabilities": (lambda t: t.cross_entropy(pr), lambda r: F.cross_entropy(r, pt)),
        "sparse_categorical_crossentropy ignored smoothed": (
            lambda t: t.sparse_categorical_crossentropy(y, ignore_index=ignore, label_smoothing=0.2),
            lambda r: F.cross_entropy(r, yt, ignore_index=ignore, label_smoothing=0.2),
        ),
        "nll_loss of log_softmax": (
            lambda t: t.log_softmax(-1).nll_loss(y),
            lambda r: F.nll_loss(r.log_softmax(-1), yt),
        ),
        "nll_loss ignored": (
            lambda t: t.log_softmax(-1).nll_loss(y, ignore_index=ignore),
            lambda r: F.nll_loss(r.log_softmax(-1), yt, ignore_index=ignore),
        ),
        "log_softmax": (lambda t: t.log_softmax(-1), lambda r: r.log_softmax(-1)),
        "rmsnorm": (lambda t: t.rmsnorm(-1), lambda r: F.rms_norm(r, r.shape[-1:], eps=1e-6)),
        "mean": (lambda t: t.mean(-1), lambda r: r.mean(-1)),
        "var": (lambda t: t.var(-1), lambda r: r.var(-1)),
    }


LOSSES = sorted(losses(np.zeros(1, np.int32), np.zeros((1, 1), np.float32), 0, "CPU"))


def check_values(device: str, name: str, rows: int, width: int, seed: int) -> None:
    a, labels, p, gv = _data(rows, width, seed)
    ours, theirs = losses(labels, p, int(labels[1 % rows]), device)[name]
    x = Tensor(a, device=device, requires_grad=True)
    r = torch.tensor(a, requires_grad=True)
    got, want = ours(x), theirs(r)
    tol = dict(rtol=2e-4, atol=2e-5)
    if name == "var" and width == 1:
        # one element: torch's unbiased variance divides by 0 (NaN, with a warning); ours is NaN too
        assert np.isnan(got.numpy()).all()
        return
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), **tol, err_msg=f"{name} forward")
    g = gv[:, 0] if want.ndim == 1 else gv if want.ndim == 2 else None
    got.backward(None if g is None else Tensor(g, device=device))
    want.backward(None if g is None else torch.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), r.grad.numpy(), rtol=2e-3, atol=2e-5, err_msg=f"{name} backward")


@pytest.mark.filterwarnings("ignore:var\\(\\)")
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", LOSSES)
def test_losses_and_gradients_match_torch_on_the_cpu(name: str, width: int) -> None:
    check_values("CPU", name, 5, width, seed=width)


@pytest.mark.filterwarnings("ignore:var\\(\\)")
@pytest.mark.parametrize("emulated_gpu", [32, 0], ids=["shuffles", "local_memory"], indirect=True)
@pytest.mark.parametrize("width", [1, 33, 1030])
def test_losses_and_gradients_match_torch_on_an_emulated_gpu(emulated_gpu: str, width: int) -> None:
    # 40 rows: a workgroup per row (not split into partial reductions)
    for name in ("cross_entropy", "sparse_categorical_crossentropy ignored smoothed", "log_softmax", "var"):
        check_values(emulated_gpu, name, 40, width, seed=width)


@pytest.mark.parametrize("offset", [0.0, 1e3, 3e4])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_of_rows_far_from_zero_is_about_as_accurate_as_torch(offset: float, smoothing: float) -> None:
    # the sum of the target times x - max is kept relative to the running max (moved by the max's raises): rows around
    # 3e4 with a spread of 3 keep the precision of their spread, as the nested form, not of their magnitude
    rng = np.random.default_rng(int(offset) + 1)
    a = (rng.standard_normal((7, 1000)) * 3 + offset).astype(np.float32)
    labels = rng.integers(0, 1000, 7)
    ours = Tensor(a).cross_entropy(Tensor(labels.astype(np.int32)), "none", smoothing).numpy()
    y = torch.tensor(labels)
    ref = F.cross_entropy(torch.tensor(a, dtype=torch.float64), y, reduction="none", label_smoothing=smoothing).numpy()
    theirs = F.cross_entropy(torch.tensor(a), y, reduction="none", label_smoothing=smoothing).numpy()
    assert np.abs(ours - ref).max() <= 5 * np.abs(theirs - ref).max() + 1e-5
