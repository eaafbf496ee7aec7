"""The shapes of the CUDA programs for bandwidth-bound work, read from the rendered programs (no GPU needed): a 2^26
fp16->float sum spread over at least one workgroup per H100/H200 multiprocessor, a workgroup per softmax and layernorm
row, at least 128 threads per workgroup for an elementwise add, a launch of more than 65,535 workgroups in y folded
into x (and compiled by NVRTC). The graphs are built on the PYTHON device with the split plans of a CUDA renderer.

Needs the lazygrad frontend."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import pytest
from cuda_helpers import ARCHS, assemble, ptxas

from lazygrad_codegen import ProgramSpec, get_program
from lazygrad_cuda.compiler import nvrtc_compile
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import eval_uop

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")
split_reduce = pytest.importorskip("lazygrad.split_reduce")
Tensor = lazygrad.Tensor

H100_SMS = 132


@pytest.fixture
def renderer(monkeypatch: pytest.MonkeyPatch) -> Iterator[CUDARenderer]:
    """An sm_90 renderer with an H100's multiprocessors, which the frontend's split plans use too."""
    r = CUDARenderer("sm_90", compute_units=H100_SMS)
    monkeypatch.setattr(split_reduce, "renderer_of", lambda device: r)
    yield r


def programs(t: object, renderer: CUDARenderer) -> list[ProgramSpec]:
    return [get_program(si.ast, renderer) for si in t.schedule() if si.ast.op is Ops.SINK]


def _t(*shape: int, dtype=dtypes.float32) -> object:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")


def test_the_fp16_sum_fills_every_multiprocessor(renderer: CUDARenderer) -> None:
    specs = programs(_t(2**26, dtype=dtypes.float16).float().sum(), renderer)
    assert len(specs) >= 2, "a 2^26 sum is split into partial sums and their sum"
    first = specs[0]
    assert math.prod(first.global_size) >= H100_SMS
    assert math.prod(first.local_size) >= 128
    # the partial sums read the whole input, each workgroup a contiguous part
    assert math.prod(first.global_size) * math.prod(first.local_size) >= 128 * H100_SMS


@pytest.mark.parametrize("kind", ["softmax", "log_softmax", "layernorm"])
def test_row_reductions_get_a_workgroup_per_row(renderer: CUDARenderer, kind: str) -> None:
    x = _t(4096, 4096)
    out = {"softmax": lambda: x.softmax(-1), "log_softmax": lambda: x.log_softmax(-1), "layernorm": x.layernorm}[kind]()
    reductions = [s for s in programs(out, renderer) if s.name.startswith("r_")]
    assert reductions
    for spec in reductions:
        assert math.prod(spec.global_size) == 4096, spec.name
        assert math.prod(spec.local_size) >= 128, spec.name
        assert "__shfl_xor_sync" in spec.src and "float4" in spec.src


@pytest.mark.parametrize("kind", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
def test_row_reductions_are_two_programs_that_nvrtc_compiles(renderer: CUDARenderer, kind: str) -> None:
    # the row's reductions in one program (one loop over the row after the other, or one loop for an online pair,
    # each result combined by shuffles and shared memory and broadcast to the workgroup), then the elementwise output
    x = _t(4096, 4096)
    specs = programs(getattr(x, kind)(-1), renderer)
    assert len(specs) == 2, [s.name for s in specs]
    first = specs[0]
    assert math.prod(first.global_size) == 4096 and math.prod(first.local_size) >= 128
    loops = first.src.count("for (")
    # softmax's max and sum of exponentials, layernorm's mean and variance run in one loop (online reductions)
    assert loops == 1, first.src
    for spec in specs:
        for arch in ARCHS:
            assert nvrtc_compile(spec.src, arch).cubin, f"{spec.name} for {arch}"


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "log_softmax", "rmsnorm", "cross_entropy"])
def test_row_backward_is_two_programs_with_one_loop_that_nvrtc_compiles(renderer: CUDARenderer, kind: str) -> None:
    # the gradient's sums over the row join the recomputed forward reductions' one loop (online reductions; the sum
    # of log_softmax's incoming gradient, or of cross-entropy's one-hot target, beside them)
    x = Tensor.empty(4096, 4096, device="PYTHON", requires_grad=True)
    if kind == "cross_entropy":
        labels = Tensor(list(range(4096)), dtype=dtypes.int32, device="PYTHON")
        x.cross_entropy(labels).backward()
    else:
        getattr(x, kind)(-1).backward(_t(4096, 4096))
    specs = programs(x.grad, renderer)
    assert len(specs) == 2, [s.name for s in specs]
    assert specs[0].src.count("for (") == 1, specs[0].src
    for spec in specs:
        for arch in ARCHS:
            assert nvrtc_compile(spec.src, arch).cubin, f"{spec.name} for {arch}"


def test_cross_entropy_is_a_workgroup_per_row_with_one_loop_then_the_mean(renderer: CUDARenderer) -> None:
    # the max, the sum of exponentials and the sum of the target times log_softmax in one loop over each row
    x = _t(4096, 4096)
    specs = programs(x.cross_entropy(Tensor(list(range(4096)), dtype=dtypes.int32, device="PYTHON")), renderer)
    assert len(specs) == 2, [s.name for s in specs]
    first = specs[0]
    assert math.prod(first.global_size) == 4096 and math.prod(first.local_size) >= 128
    assert first.src.count("for (") == 1, first.src
    for spec in specs:
        for arch in ARCHS:
            assert nvrtc_compile(spec.src, arch).cubin, f"{spec.name} for {arch}"


def test_the_fp16_add_has_at_least_128_threads_per_workgroup(renderer: CUDARenderer) -> None:
    (spec,) = programs(_t(2**26, dtype=dtypes.float16) + _t(2**26, dtype=dtypes.float16), renderer)
    assert 128 <= math.prod(spec.local_size) <= 512
    assert "lg_halfx8" in spec.src  # vectors of 8 halves


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fp16_add_loads_and_stores_128_bits_at_a_time(renderer: CUDARenderer, arch: str) -> None:
    (spec,) = programs(_t(2**26, dtype=dtypes.float16) + _t(2**26, dtype=dtypes.float16), renderer)
    ptx = nvrtc_compile(spec.src, arch).ptx.decode()
    accesses = [line.split()[0] for line in ptx.splitlines() if re.match(r"\s*(ld|st)\.global", line)]
    # four 32-bit lanes (or two 64-bit ones) per instruction: 128 bits
    wide = re.compile(r"(ld|st)\.global(\.nc)?\.(v4\.[bfu]32|v2\.[bfu]64)$")
    assert accesses and all(wide.match(a) for a in accesses), accesses
    assert sum(a.startswith("ld") for a in accesses) == 2 and sum(a.startswith("st") for a in accesses) == 1


def test_a_launch_past_65535_in_y_is_folded_and_compiles(renderer: CUDARenderer, tmp_path) -> None:
    # 100352 x 2 x 3 output axes: the plain layout puts 100352 in z, over CUDA's 65,535
    x = _t(100352, 2, 3).permute(2, 1, 0).contiguous().permute(2, 1, 0) * 2
    specs = programs(x, renderer)
    for spec in specs:
        assert all(d <= lim for d, lim in zip(spec.global_size, renderer.global_max, strict=True)), spec.global_size
    for spec in specs:
        out = nvrtc_compile(spec.src, ARCHS[-1])
        assert out.cubin, "NVRTC compiled the folded launch to machine code"
        if ptxas()[0] is not None:
            assemble(out.ptx, ARCHS[-1], tmp_path, spec.name)


def _neighbour_strides(spec: ProgramSpec) -> list[int]:
    """For each load from global memory: how many bytes apart two neighbouring threads (lidx0 and lidx0 + 1, every
    other index 0) read, from the index expression of the linear program (Python integers)."""
    strides = []
    for u in spec.uops:
        if u.op is not Ops.LOAD or u.src[0].op is not Ops.INDEX or u.src[0].src[0].op is not Ops.DEFINE_GLOBAL:
            continue
        idx = u.src[0].src[1]
        free = [n for n in idx.toposort if n.op in (Ops.SPECIAL, Ops.RANGE, Ops.DEFINE_VAR)]
        at = {n: 0 for n in free}
        lidx0 = [n for n in free if n.op is Ops.SPECIAL and n.arg[0] == "lidx0"]
        if not lidx0:
            strides.append(0)
            continue
        first = eval_uop(idx, at)
        strides.append(abs(eval_uop(idx, {**at, lidx0[0]: 1}) - first) * u.src[0].src[0].dtype.base.itemsize)
    return strides


@pytest.mark.parametrize(
    "kind", ["max0_4096x4096", "sum023_64x64x56x56", "sum023_64x512x7x7", "sum023_64x64x112x112", "bn_backward"]
)
def test_strided_reductions_fill_the_gpu_with_coalesced_loads(renderer: CUDARenderer, kind: str) -> None:
    # a column reduction and BatchNorm statistics (per channel of an NCHW tensor): the kernel that reads the input
    # has at least 4 warps per H100 SM in workgroups of at least 128 threads, whose neighbouring threads read at
    # most 16 bytes apart (one vector), and the program is one reading kernel plus at most one short combine
    if kind == "max0_4096x4096":
        out = _t(4096, 4096).max(0)
    elif kind == "bn_backward":
        # the gradient's sums over (N, H, W) are built as reductions directly (no split in the frontend)
        x = Tensor.empty(64, 64, 56, 56, device="PYTHON", requires_grad=True)
        w = Tensor.empty(64, device="PYTHON", requires_grad=True)
        (x * w.reshape(1, -1, 1, 1)).sum().backward()
        out = w.grad
    else:
        shape = tuple(int(d) for d in kind.split("_")[1].split("x"))
        out = _t(*shape).sum((0, 2, 3))
    specs = programs(out, renderer)
    assert 1 <= len(specs) <= 2, [s.name for s in specs]
    first = specs[0]
    warps = math.prod(first.global_size) * math.prod(first.local_size) // 32
    assert math.prod(first.local_size) >= 128 and warps >= 4 * H100_SMS, (first.global_size, first.local_size)
    strides = _neighbour_strides(first)
    assert strides and max(strides) <= 16, strides
    for spec in specs:
        assert nvrtc_compile(spec.src, ARCHS[-1]).cubin, spec.name


@pytest.mark.parametrize(("k", "m"), [(768, 2304), (3072, 768), (768, 3072)])
def test_row_times_matrix_fills_the_gpu_and_its_parts_sum_in_many_workgroups(
    renderer: CUDARenderer, k: int, m: int
) -> None:
    # GPT-2's decoding step: x (one row) @ W (k, m). The rows of W are summed in parts by coalesced threads over
    # every multiprocessor (main had 9 workgroups of 32 threads for 768x2304), then the parts by a workgroup per
    # warp's width of outputs whose threads split the parts, never one thread per 16 outputs over every part
    specs = programs(_t(1, k) @ _t(k, m), renderer)
    assert len(specs) >= 2, [s.name for s in specs]
    first, last = specs[0], specs[-1]
    warps = math.prod(first.global_size) * math.prod(first.local_size) // 32
    assert warps >= 4 * H100_SMS, (first.global_size, first.local_size)
    assert max(_neighbour_strides(first)) <= 16
    assert math.prod(last.global_size) >= m // 32 and math.prod(last.local_size) >= 128, (
        last.global_size,
        last.local_size,
    )
    for spec in specs:
        assert nvrtc_compile(spec.src, ARCHS[-1]).cubin, spec.name
