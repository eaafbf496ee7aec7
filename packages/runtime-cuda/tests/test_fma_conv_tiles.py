"""ResNet-18's float32 3x3 convolutions as its training step builds them, their input a padded expression stored by
a kernel of its own (relu of a normalised tensor: the frontend pads it by a select), rendered for CUDA (sm_80, 132
multiprocessors as on an H100) without a GPU: every pass is staged, fills the GPU with warps, loads at most 1/16 byte
from global memory per FLOP, and compiles with NVRTC for sm_80 and sm_90 without register spills."""

from __future__ import annotations

import math

import pytest

from lazygrad_codegen import Kernel, Opt, OptOps, get_program, tiling
from lazygrad_codegen.kernel import AxisType
from lazygrad_codegen.memory_traffic import global_load_bytes
from lazygrad_cuda.compiler import ptxas_usage
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")


def _matmul_like(ast) -> bool:
    """One sum of a product of two reads (each a load, or a load selected by its padding)."""
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1 or reduces[0].src[0].op is not Ops.MUL:
        return False
    return all(s.op is Ops.LOAD or (s.op is Ops.WHERE and s.src[1].op is Ops.LOAD) for s in reduces[0].src[0].src)


@pytest.mark.parametrize(("channels", "size"), [(512, 7), (64, 56)])
def test_resnet_layer_passes_are_staged_and_fill_the_gpu(cuda_graphs, channels: int, size: int) -> None:
    tensor = lazygrad.Tensor
    renderer = cuda_graphs
    x = tensor.empty(64, channels, size, size, device="PYTHON").requires_grad_()
    w = tensor.empty(channels, channels, 3, 3, device="PYTHON").requires_grad_()
    y = ((x - x.mean((0, 2, 3), keepdim=True)) + 0.5).relu()
    out = y.conv2d(w, padding=1)
    passes = [out, *out.gradient(x, w, gradient=tensor.empty(*out.shape, device="PYTHON"))]
    convs, selected = 0, 0
    for si in tensor.schedule(*passes):
        if si.ast.op is not Ops.SINK or not _matmul_like(si.ast):
            continue
        selected += tiling.without_padding_selects(Kernel(si.ast, renderer)) is not Kernel(si.ast, renderer)
        spec = get_program(si.ast, renderer)
        assert Opt(OptOps.STAGE) in spec.opts, f"{spec.name} is not staged: {spec.opts}"
        tiled = Kernel(si.ast, renderer).apply_opts(list(spec.opts))
        warps = math.prod(spec.global_size) * math.prod(spec.local_size) // 32
        # 16 warps per multiprocessor in all, unless the register tile is the smallest already
        assert warps >= tiling.FMA_WARPS_PER_UNIT * 132 or tiled.lanes(AxisType.UPCAST) == 16, (spec.name, warps)
        flops = 2 * math.prod(int(s) for s in Kernel(si.ast, renderer).full_shape)
        loaded = global_load_bytes(spec.uops, spec.global_size, spec.local_size)
        assert loaded * 16 <= flops * 1.01, (spec.name, loaded / flops)
        for arch in ("sm_80", "sm_90"):
            use = ptxas_usage(spec.src, arch, spec.name)
            assert use.spills == 0 and use.registers <= 255, (spec.name, arch, use)
        convs += 1
    # the weight gradient reads the padded expression (the forward too, where it is not fused with more sums)
    assert convs >= 1 and selected >= 1
    assert x.dtype == dtypes.float32
