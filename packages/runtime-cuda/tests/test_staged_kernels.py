"""The default kernels of compute-bound work on CUDA (fp16, bf16 and fp32 matmuls; the forward, input-gradient and
weight-gradient convolutions of a ResNet 3x3 layer at batch 64) are staged through shared memory (matmuls by cp.async
from sm_80 on), compile with NVRTC for sm_80 and sm_90, and ptxas (run by NVRTC, `--ptxas-options=-v`) reports no
register spills for them. No GPU needed: nothing runs."""

from __future__ import annotations

import math
import re

import pytest

from lazygrad_codegen import Opt, OptOps, get_program, tiling
from lazygrad_cuda.compiler import nvrtc_compile, ptxas_usage
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_cuda.tensor_cores import TENSOR_CORES
from lazygrad_uop.config import TF32, Context
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")
functional = pytest.importorskip("lazygrad.functional")

Tensor = lazygrad.Tensor


def _t(*shape: int, dtype: DType) -> Tensor:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")


def _matmul(dtype: DType) -> list[Tensor]:
    return [_t(4096, 4096, dtype=dtype) @ _t(4096, 4096, dtype=dtype)]


def _odd_matmul(dtype: DType) -> list[Tensor]:
    # no tile divides 4095 or 4097: padded to whole tiles, the same 128x128 tile of 8 warps (256 threads)
    return [_t(4095, 4097, dtype=dtype) @ _t(4097, 1000, dtype=dtype)]


def _conv_passes(dtype: DType) -> list[Tensor]:
    x, w = _t(64, 64, 56, 56, dtype=dtype).requires_grad_(), _t(64, 64, 3, 3, dtype=dtype).requires_grad_()
    out = x.conv2d(w, padding=1)
    return [out, *out.gradient(x, w, gradient=_t(64, 64, 56, 56, dtype=dtype))]


def _staged(spec) -> bool:
    """Whether `spec` was staged (with any number of pipeline stages)."""
    return any(o.op is OptOps.STAGE for o in spec.opts)


def _matmul_like(ast) -> bool:
    """A kernel with one sum whose operand is a product (the ones that must be staged)."""
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    x = reduces[0].src[0] if len(reduces) == 1 else None
    while x is not None and x.op is Ops.CAST:
        x = x.src[0]
    return x is not None and x.op is Ops.MUL


@pytest.mark.parametrize(
    ("what", "build"),
    [
        ("matmul_fp16", lambda: _matmul(dtypes.float16)),
        ("matmul_bf16", lambda: _matmul(dtypes.bfloat16)),
        ("matmul_fp32", lambda: _matmul(dtypes.float32)),
        ("odd_matmul_fp16", lambda: _odd_matmul(dtypes.float16)),
        ("odd_matmul_fp32", lambda: _odd_matmul(dtypes.float32)),
        ("conv_fp16", lambda: _conv_passes(dtypes.float16)),
        ("conv_fp32", lambda: _conv_passes(dtypes.float32)),
        # TF32=1: float32 on the TF32 tensor core (mma.sync m16n8k8 .tf32), staged as fp16 is
        ("matmul_fp32_tf32", lambda: _matmul(dtypes.float32)),
        ("odd_matmul_fp32_tf32", lambda: _odd_matmul(dtypes.float32)),
        ("conv_fp32_tf32", lambda: _conv_passes(dtypes.float32)),
    ],
)
def test_default_staged_kernels_compile_without_spills(what: str, build) -> None:
    # sm_80 and sm_90 get the same mma.sync tensor cores (sm_90's wgmma only with WGMMA=1), so the same source;
    # each is compiled for both
    assert TENSOR_CORES["sm_80"] == tuple(tc for tc in TENSOR_CORES["sm_90"] if not tc.shared_operands)
    renderer = CUDARenderer("sm_80", TENSOR_CORES["sm_80"])
    staged = 0
    tf32 = "tf32" in what
    for t in build():
        for si in t.schedule():
            if si.ast.op is not Ops.SINK or not _matmul_like(si.ast):
                continue
            with Context(TF32=int(tf32)):
                spec = get_program(si.ast, renderer)
            assert _staged(spec), f"{what}: {spec.name} is not staged: {spec.opts}"
            if tf32:
                # each float32 operand rounded (ties away) before the mma; read from shared memory by plain 4-byte
                # loads (ldmatrix moves 16-bit elements)
                assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in spec.src, f"{what}: {spec.name}"
                assert "cvt.rna.tf32.f32" in spec.src and "ldmatrix" not in spec.src
            elif "fp32" in what:
                assert "mma.sync" not in spec.src, f"{what}: {spec.name} runs float32 on a tensor core without TF32=1"
            else:
                assert "mma.sync" in spec.src, f"{what}: {spec.name} is not on tensor cores"
            if "odd" in what:
                # the tensor-core tile's warps (TF32's too); 256 threads of the FMA tile
                threads = 32 * tiling.TC_WARPS if tf32 or "fp32" not in what else 256
                assert math.prod(spec.local_size) == threads, f"{what}: {spec.name} {spec.local_size} {spec.opts}"
            elif "matmul" in what and tf32:
                assert "cp.async.cg.shared.global" in spec.src and "cp.async.wait_group" in spec.src
            elif "matmul" in what and "fp32" not in what:
                # whole 16-byte rows of both operands: copied by cp.async in a pipeline
                assert "cp.async.cg.shared.global" in spec.src and "cp.async.wait_group" in spec.src
                # fragments read from shared memory as 8x8 matrices, B's transposed
                assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in spec.src, f"{what}: {spec.name} has no ldmatrix"
                assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in spec.src
            for arch in ("sm_80", "sm_90"):
                log = nvrtc_compile(spec.src, arch, spec.name, options=("--ptxas-options=-v",)).log
                found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
                registers = re.search(r"Used (\d+) registers", log)
                assert found is not None and registers is not None, f"no ptxas report in NVRTC's log:\n{log}"
                assert found.groups() == ("0", "0"), f"{what}: {spec.name} spills on {arch}:\n{log}"
                assert int(registers.group(1)) <= 255
            staged += 1
    assert staged >= (3 if "conv" in what else 1)


def test_asynchronous_copies_start_at_ampere() -> None:
    assert CUDARenderer("sm_80").has_async_copy and CUDARenderer("sm_90").has_async_copy
    assert not CUDARenderer("sm_75").has_async_copy


def test_ldmatrix_starts_at_turing() -> None:
    assert CUDARenderer("sm_75").has_ldmatrix and CUDARenderer("sm_90").has_ldmatrix
    assert not CUDARenderer("sm_70").has_ldmatrix


def _spills(spec) -> list[str]:
    """The archs of sm_80 and sm_90 for which ptxas reports register spills in `spec`."""
    return [arch for arch in ("sm_80", "sm_90") if ptxas_usage(spec.src, arch, spec.name).spills]


@pytest.mark.parametrize(("dtype", "tf32"), [(dtypes.float16, 0), (dtypes.float32, 0), (dtypes.float32, 1)])
@pytest.mark.parametrize(("cout", "stride"), [(64, 1), (128, 2)])
def test_convolution_gradients_fill_the_gpu(cuda_graphs, dtype: DType, tf32: int, cout: int, stride: int) -> None:
    with Context(TF32=tf32):  # the split of the weight gradient counts the warps of the tile codegen picks
        _convolution_gradients_fill_the_gpu(cuda_graphs, dtype, cout, stride)


def _convolution_gradients_fill_the_gpu(renderer: CUDARenderer, dtype: DType, cout: int, stride: int) -> None:
    from lazygrad_codegen.reductions import SPLIT_K_MAX

    on_tensor_cores = dtype == dtypes.float16 or bool(TF32)
    # ResNet-18's first 3x3 layer of its first stage (64 -> 64), and of its second (64 -> 128, stride 2), batch 64
    x, w = _t(64, 64, 56, 56, dtype=dtype).requires_grad_(), _t(cout, 64, 3, 3, dtype=dtype).requires_grad_()
    out = x.conv2d(w, padding=1, stride=stride)
    dx, dw = out.gradient(x, w, gradient=_t(*out.shape, dtype=dtype))
    # the input gradient: one staged kernel, as many workgroups as the forward's (on tensor cores after the
    # channels-last copies of the padded output's gradient and of the weight, at stride 2 its taps regrouped by phase:
    # `lazygrad.functional.CONV_CHANNELS_LAST`)
    *copies, dx_item = dx.schedule()
    assert len(copies) == (2 if on_tensor_cores else 0)
    dx_spec = get_program(dx_item.ast, renderer)
    assert _staged(dx_spec) and not _spills(dx_spec)
    # the weight gradient: a staged kernel of parts with a workgroup or more per multiprocessor (unsplit, its 64 x 576
    # outputs made 9), then their sum, which reads at most SPLIT_K_MAX values per weight
    *_, parts_item, sum_item = dw.schedule()
    spec = get_program(parts_item.ast, renderer)
    assert _staged(spec), spec.opts
    # `tiling.FMA_WARPS_PER_UNIT` warps per multiprocessor or more, over a workgroup per multiprocessor or nearly (the
    # parts divide the axis they cut: 126 workgroups for 132 multiprocessors at 128 channels, stride 2, on FMA units)
    warps = math.prod(spec.global_size) * math.prod(spec.local_size) // 32
    assert warps >= tiling.FMA_WARPS_PER_UNIT * renderer.compute_units and renderer.compute_units == 132
    assert math.prod(spec.global_size) >= 0.9 * renderer.compute_units, spec.global_size
    # 4 warps on tensor cores (two along the 64 or 128 output channels), 64 threads or more on FMA units
    assert math.prod(spec.local_size) >= (128 if on_tensor_cores else 64), spec.local_size
    assert not _spills(spec)
    assert sum_item.bufs[0].size == cout * 64 * 9 and sum_item.bufs[1].size <= SPLIT_K_MAX * cout * 64 * 9
    assert ("mma.sync" in spec.src and "mma.sync" in dx_spec.src) == on_tensor_cores


def _conv(cin: int, cout: int, k: int, stride: int, size: int, dtype: DType, which: int) -> Tensor:
    """Pass `which` (0 forward, 1 input gradient, 2 weight gradient) of a ResNet-18 convolution at batch 64."""
    x, w = _t(64, cin, size, size, dtype=dtype).requires_grad_(), _t(cout, cin, k, k, dtype=dtype).requires_grad_()
    out = x.conv2d(w, padding=k // 2, stride=stride)
    return [out, *out.gradient(x, w, gradient=_t(*out.shape, dtype=dtype))][which]


@pytest.mark.parametrize(
    ("what", "build"),
    [
        # the programs of the benchmark set that ptxas for sm_80 once spilled in: weight gradients with 64 fp32
        # accumulators per thread and synchronous copies (their inputs are strided), a 1x1 stride-2 forward, the fp32
        # stem's weight gradient (`python benchmarks/gpu_registers.py` compiles the whole set)
        ("conv fp16 64->128 k3 s2 weight grad", lambda: _conv(64, 128, 3, 2, 56, dtypes.float16, 2)),
        ("conv fp16 64->128 k1 s2 weight grad", lambda: _conv(64, 128, 1, 2, 56, dtypes.float16, 2)),
        ("conv fp16 128->128 k3 s1 weight grad", lambda: _conv(128, 128, 3, 1, 28, dtypes.float16, 2)),
        ("conv fp16 256->512 k1 s2 forward", lambda: _conv(256, 512, 1, 2, 14, dtypes.float16, 0)),
        ("conv fp32 3->64 k7 s2 weight grad", lambda: _conv(3, 64, 7, 2, 224, dtypes.float32, 2)),
        # sizes no tile divides, and a batch
        (
            "matmul fp16 4095x4097x1000",
            lambda: _t(4095, 4097, dtype=dtypes.float16) @ _t(4097, 1000, dtype=dtypes.float16),
        ),
        (
            "bmm fp32 16x1024^3",
            lambda: _t(16, 1024, 1024, dtype=dtypes.float32) @ _t(16, 1024, 1024, dtype=dtypes.float32),
        ),
    ],
)
def test_default_programs_compile_without_spills(cuda_graphs, what: str, build) -> None:
    renderer = cuda_graphs
    programs = 0
    for si in build().schedule():
        if si.ast.op is not Ops.SINK:
            continue
        spec = get_program(si.ast, renderer)
        for arch in ("sm_80", "sm_90"):
            use = ptxas_usage(spec.src, arch, spec.name)
            assert use.spills == 0, f"{what}: {spec.name} spills {use} on {arch}"
            assert use.registers <= 255
        programs += 1
    assert programs >= 1


def _loops(src: str) -> list[tuple[str, list[str]]]:
    """(the line before it, its body) of each `for` loop of CUDA C `src`, found by indentation (the renderer indents
    each block by two more spaces and closes it at its own indentation)."""
    lines = src.splitlines()
    out = []
    for i, head in enumerate(lines):
        if head.lstrip().startswith("for ("):
            indent = head[: len(head) - len(head.lstrip())]
            end = next(j for j in range(i + 1, len(lines)) if lines[j] == indent + "}")
            out.append((lines[i - 1].strip(), lines[i + 1 : end]))
    return out


def test_staged_main_loops_are_not_unrolled(cuda_graphs) -> None:
    # the loops around a staged weight gradient's barriers carry `#pragma unroll 1`; the loops of its parts' sum,
    # which has no barrier, do not
    *_, parts, total = _conv(64, 128, 3, 2, 56, dtypes.float16, 2).schedule()
    loops = _loops(get_program(parts.ast, cuda_graphs).src)
    assert any("__syncthreads();" in line for _, body in loops for line in body)
    for before, body in loops:
        assert (before == "#pragma unroll 1") == any("__syncthreads();" in line for line in body)
    assert "#pragma unroll" not in get_program(total.ast, cuda_graphs).src


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float32])
@pytest.mark.parametrize(
    ("cin", "cout", "k", "stride", "size"), [(64, 64, 3, 1, 56), (64, 128, 1, 2, 56), (3, 64, 7, 2, 224)]
)
def test_split_k_counts_the_tiles_it_gets(monkeypatch, cuda_graphs, dtype, cin, cout, k, stride, size) -> None:
    from lazygrad_codegen.reductions import gemm_launch

    # the weight gradient left whole: the workgroups and threads of its program are what gemm_launch predicts (its
    # tile is 64 wide along 64 channels and 1 along each tap: 9 workgroups for the 64 -> 64 3x3 layer in fp16, where
    # 128x128 tiles of its 64 x 576 outputs would count 5)
    monkeypatch.setattr(functional, "split_k_parts", lambda *a, **kw: 1)
    # the direct kernel's (not the product over the window matrix, the GPU's default where a convolution doesn't read
    # channels-last: `functional.IM2COL_WEIGHT_GRADIENT`)
    with Context(IM2COL_WEIGHT_GRADIENT=0):
        *_, item = _conv(cin, cout, k, stride, size, dtype, 2).schedule()
    spec = get_program(item.ast, cuda_graphs)
    out = (size + 2 * (k // 2) - k) // stride + 1
    taps = tuple(v for v in (cin, k, k) if v > 1)
    predicted = gemm_launch(cuda_graphs, dtype, (cout,), taps, (64, out, out))
    assert predicted.workgroups == math.prod(spec.global_size)
    assert predicted.threads == math.prod(spec.local_size)


def test_three_stage_pipeline_compiles_without_spills() -> None:
    from lazygrad_codegen.kernel_ast import matmul

    # the default fp16 tile's warps and register tile at K step 16, whose three stages' buffers fit 48 KB: the copies
    # of two steps ahead in flight, each step's wait leaving the latest group in flight
    renderer = CUDARenderer("sm_80", TENSOR_CORES["sm_80"])
    default = get_program(matmul(4096, 4096, 4096, dtypes.float16), renderer).opts
    opts = [o for o in default if o.op is not OptOps.UNROLL and o.op is not OptOps.STAGE]
    spec = get_program(matmul(4096, 4096, 4096, dtypes.float16), renderer, [*opts, Opt(OptOps.STAGE, None, 3)])
    assert "cp.async.wait_group 1;" in spec.src and "cp.async.wait_group 0;" not in spec.src
    assert not _spills(spec)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fp16_matmul_pipelines_four_stages_in_dynamic_shared_memory(arch: str) -> None:
    from lazygrad_codegen.kernel_ast import matmul
    from lazygrad_cuda.compiler import dynamic_shared

    renderer = CUDARenderer(arch, TENSOR_CORES[arch])
    spec = get_program(matmul(4096, 4096, 4096, dtypes.float16), renderer)
    # the default: four stages (tiling.DEEP_STAGES) of a 32-element reduction step, over 48 KB: dynamic
    assert spec.opts[-1] == Opt(OptOps.STAGE, None, 4) and Opt(OptOps.UNROLL, 0, 2) in spec.opts, spec.opts
    # four slots per operand: 128 rows of A by 32 of K (rows padded by 8 halves), 32 rows of B by 128 of N (+8)
    want = 4 * (128 * (32 + 8) + 32 * (128 + 8)) * 2
    assert sum(u.dtype.size * u.dtype.base.itemsize for u in spec.uops if u.op is Ops.DEFINE_LOCAL) == want
    assert 48 * 1024 < want <= renderer.shared_max
    assert "extern __shared__" in spec.src and "__shared__ __align__(16) half" not in spec.src
    # each step waits for its own group with the next two in flight, and has one barrier
    ((_, body),) = [loop for loop in _loops(spec.src) if any("cp.async" in line for line in loop[1])]
    assert sum("__syncthreads();" in line for line in body) == 1
    assert sum("cp.async.wait_group 2;" in line for line in body) == 1
    # the copies of three steps ahead come before the fragments they overlap
    first_ldmatrix = next(i for i, line in enumerate(body) if "ldmatrix" in line)
    assert max(i for i, line in enumerate(body) if "cp.async.cg" in line) < first_ldmatrix
    # the last steps' copies (zero fills) are waited for once, after the stores, before the block exits
    tail = spec.src.rstrip().splitlines()
    assert "cp.async.wait_all;" in tail[-2] and tail[-1] == "}" and spec.src.count("cp.async.wait_all") == 1
    assert max(i for i, line in enumerate(tail) if "data0" in line) < len(tail) - 2
    # the byte count travels in the binary, cubin or PTX, for the program to launch it with
    for nvrtc_arch in (arch, arch.replace("sm_", "compute_")):
        out = nvrtc_compile(spec.src, nvrtc_arch, spec.name, options=("--ptxas-options=-v",))
        assert dynamic_shared(out.cubin if out.cubin is not None else out.ptx + b"\0") == want
        if out.cubin is not None:
            assert "0 bytes spill stores, 0 bytes spill loads" in out.log, out.log
    # a kernel whose buffers fit the static limit declares them statically, and its binary asks for none
    small = get_program(matmul(4096, 4096, 4096, dtypes.float16), renderer, [*spec.opts[:-1], Opt(OptOps.STAGE)])
    assert "extern __shared__" not in small.src
    plain = get_program(matmul(64, 64, 64, dtypes.float32), renderer, [])
    assert "cp.async" not in plain.src  # nothing to wait for
    assert dynamic_shared(nvrtc_compile(small.src, arch, small.name).cubin) == 0


def test_shared_memory_limits_are_each_architectures_opt_in_maximum() -> None:
    # CUDA C Programming Guide, maximum shared memory per thread block: 163 KB on sm_80, 99 KB on sm_86 and sm_89,
    # 227 KB on sm_90; the static 48 KB where the renderer knows of no opt-in
    kb = {arch: CUDARenderer(arch).shared_max / 1024 for arch in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_52")}
    assert kb == {"sm_80": 163, "sm_86": 99, "sm_89": 99, "sm_90": 227, "sm_52": 48}


def test_default_takes_the_deepest_pipeline_that_fits_the_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from lazygrad_codegen.kernel_ast import matmul

    monkeypatch.setattr(tiling, "DEEP_STAGES", (4, 3))  # the default
    # a stage of the default 128x128 tile at K step 32 is 128 x (32 + 8) + 32 x (128 + 8) halves, 18.9 KB: every
    # architecture from sm_80 on holds four; a GPU with less shared memory gets as many as fit, two at least
    stage = (128 * (32 + 8) + 32 * (128 + 8)) * 2
    for limit_kb, stages in ((227, 4), (99, 4), (60, 3), (48, 2)):
        renderer = CUDARenderer("sm_90", TENSOR_CORES["sm_90"])
        renderer.shared_max = limit_kb * 1024
        spec = get_program(matmul(4096, 4096, 4096, dtypes.float16), renderer)
        assert spec.opts[-1].op is OptOps.STAGE and (spec.opts[-1].arg or 2) == stages, (limit_kb, spec.opts)
        assert stages == max(n for n in (2, 3, 4) if n * stage <= renderer.shared_max)


def test_a_stem_weight_gradient_is_split_past_its_batch(cuda_graphs) -> None:
    """ResNet's stem (3 -> 64 channels, 7x7, stride 2) at batch 16: its weight gradient over the window matrix is one
    tile unsplit (64 x 147 outputs); its parts are runs of the matrix's rows, not whole images, so there are enough
    of them for a workgroup per multiprocessor (cut by image it got 16, and at batch 64 on an H100, 64 of 132)."""
    renderer = cuda_graphs
    x, w = _t(16, 3, 112, 112, dtype=dtypes.float16).requires_grad_(), _t(64, 3, 7, 7, dtype=dtypes.float16)
    w.requires_grad_()
    out = x.conv2d(w, padding=3, stride=2)
    (dw,) = out.gradient(w, gradient=_t(*out.shape, dtype=dtypes.float16))
    items = [si for si in dw.schedule() if si.ast.op is Ops.SINK]
    sums = [si for si in items if any(u.op is Ops.REDUCE_AXIS for u in si.ast.toposort)]
    partial = next(si for si in sums if si.bufs[0].size % (64 * 147) == 0 and si.bufs[0].size > 64 * 147)
    parts = partial.bufs[0].size // (64 * 147)
    assert 16 < parts and (16 * 56 * 56) % parts == 0, parts
    spec = get_program(partial.ast, renderer)
    assert math.prod(spec.global_size) >= renderer.compute_units and _staged(spec), (spec.global_size, spec.opts)
