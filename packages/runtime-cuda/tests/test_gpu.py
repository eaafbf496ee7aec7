"""The CUDA device on a real GPU, against numpy: copies, sub-buffers and pinned memory, kernels using shared memory,
vectors and barriers, mma.sync tensor cores, timing, CUDA graphs, transfers between GPUs, and Tensors on CUDA.
Every test skips, saying why, on a machine without an NVIDIA GPU and driver."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    glob,
    linear,
    load,
    mma_program,
    shared_vector_program,
    shared_vector_reference,
    special,
    store,
    tf32_mma_program,
)

from lazygrad_cuda.device import CUDADevice
from lazygrad_cuda.graph import CUDAGraph
from lazygrad_uop.device import BufferSpec, KernelLaunch
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

RNG = np.random.default_rng(0)


def _to_gpu(gpu: CUDADevice, arr: np.ndarray):
    buf = gpu.allocator.alloc(max(arr.nbytes, 1))
    gpu.allocator.copyin(buf, memoryview(np.ascontiguousarray(arr)).cast("B"))
    return buf


def _from_gpu(gpu: CUDADevice, buf, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    gpu.allocator.copyout(memoryview(out).cast("B"), buf)
    return out


def _program(gpu: CUDADevice, uops: list[UOp]):
    name = uops[-1].arg
    return gpu.load_program(name, gpu.compiler.compile(gpu.renderer.render(uops)))


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns of float32 values that bfloat16 holds exactly."""
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_copies_round_trip_through_staging(gpu: CUDADevice) -> None:
    data = RNG.standard_normal(3 * gpu.allocator.STAGING_CHUNK // 4 + 5).astype(np.float32)  # several chunks
    buf = _to_gpu(gpu, data)
    np.testing.assert_array_equal(_from_gpu(gpu, buf, data), data)
    part = gpu.allocator._offset(buf, 400, 4000)
    np.testing.assert_array_equal(_from_gpu(gpu, part, np.empty(100, np.float32)), data[1000:1100])
    pinned = gpu.allocator.alloc(64, BufferSpec(host=True))
    gpu.allocator.copyin(pinned, memoryview(bytes(range(64))))
    out = bytearray(64)
    gpu.allocator.copyout(memoryview(out), pinned)
    assert bytes(out) == bytes(range(64))


def test_shared_memory_vectors_and_barrier(gpu: CUDADevice) -> None:
    src = RNG.standard_normal(64).astype(np.float32)
    out, halves = np.zeros(64, np.float32), np.zeros(32, np.float16)
    bufs = [_to_gpu(gpu, out), _to_gpu(gpu, src), _to_gpu(gpu, halves)]
    _program(gpu, shared_vector_program())(*bufs, local_size=(16, 1, 1), wait=True)
    want_out, want_halves = shared_vector_reference(src.tolist())
    np.testing.assert_array_equal(_from_gpu(gpu, bufs[0], out), np.array(want_out, np.float32))
    np.testing.assert_array_equal(_from_gpu(gpu, bufs[2], halves), np.array(want_halves, np.float32).astype(np.float16))


@pytest.mark.parametrize("k", [16, 8])
@pytest.mark.parametrize("dtype_in", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_mma_sync_matches_numpy(gpu: CUDADevice, dtype_in: DType, k: int) -> None:
    if int(gpu.arch[3:5]) < 80:
        pytest.skip(f"mma.sync m16n8k{k} with {dtype_in} needs sm_80 or newer; this GPU is {gpu.arch}")
    a = RNG.integers(-4, 5, (16, k)).astype(np.float32)
    b = RNG.integers(-4, 5, (k, 8)).astype(np.float32)
    if dtype_in == dtypes.float16:
        a_in, b_in = a.astype(np.float16), b.astype(np.float16)
    else:
        a_in, b_in = _bf16_bits(a), _bf16_bits(b)
    d = np.zeros((16, 8), np.float32)
    bufs = [_to_gpu(gpu, d), _to_gpu(gpu, a_in), _to_gpu(gpu, b_in)]
    _program(gpu, mma_program(dtype_in, k))(*bufs, local_size=(32, 1, 1), wait=True)
    np.testing.assert_array_equal(_from_gpu(gpu, bufs[0], d), a @ b)


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to TF32 by its bits: to nearest, ties away from zero (finite values)."""
    return ((x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_tf32_mma_sync_rounds_its_inputs(gpu: CUDADevice) -> None:
    if int(gpu.arch[3:5]) < 80:
        pytest.skip(f"mma.sync m16n8k8 .tf32 needs sm_80 or newer; this GPU is {gpu.arch}")
    # small integers plus a fraction below TF32's last bit, so products and sums are exact on TF32-rounded values
    a = (RNG.integers(-4, 5, (16, 8)) * (1 + 2.0**-12)).astype(np.float32)
    b = (RNG.integers(-4, 5, (8, 8)) * (1 + 3 * 2.0**-11)).astype(np.float32)
    d = np.zeros((16, 8), np.float32)
    bufs = [_to_gpu(gpu, d), _to_gpu(gpu, a), _to_gpu(gpu, b)]
    _program(gpu, tf32_mma_program())(*bufs, local_size=(32, 1, 1), wait=True)
    got = _from_gpu(gpu, bufs[0], d)
    np.testing.assert_allclose(got, _tf32(a).astype(np.float64) @ _tf32(b).astype(np.float64), rtol=1e-6)
    assert not np.allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-6)


def _add_program(n: int) -> list[UOp]:
    """data0[i] = data1[i] + data2[i] + k for n blocks of one thread, k a variable."""
    i = special("gidx0", n)
    k = UOp.variable("k", -1000, 1000)
    total = load(glob(1, dtypes.float32, n), i) + load(glob(2, dtypes.float32, n), i) + k.cast(dtypes.float32)
    prog = linear("add_k", store(glob(0, dtypes.float32, n), i, total))
    # the variable is a parameter after the buffers
    globals_ = [u for u in prog if u.op is Ops.DEFINE_GLOBAL]
    return [*globals_, k, *(u for u in prog if u.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR))]


def test_launch_timing_and_graph_replay(gpu: CUDADevice) -> None:
    n = 1000
    x, y = RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)
    out = np.zeros(n, np.float32)
    bx, by, b1, b2 = _to_gpu(gpu, x), _to_gpu(gpu, y), _to_gpu(gpu, out), _to_gpu(gpu, out)
    prog = _program(gpu, _add_program(n))
    seconds = prog(b1, bx, by, global_size=(n, 1, 1), vals=(3,), wait=True)
    assert seconds is not None and 0 < seconds < 1
    np.testing.assert_allclose(_from_gpu(gpu, b1, out), x + y + 3, rtol=1e-6)
    launches = [
        KernelLaunch(prog, (b1, bx, by), (n, 1, 1), vals=(1,)),
        KernelLaunch(prog, (b2, b1, by), (n, 1, 1), vals=(2,)),
    ]
    graph = CUDAGraph(gpu, launches)
    assert graph(wait=True) > 0
    # the reference adds in the kernels' order, in float32: x + 2*y + 3 rounds differently where it nearly cancels
    f32 = np.float32
    first = (x + y) + f32(1)
    np.testing.assert_array_equal(_from_gpu(gpu, b2, out), (first + y) + f32(2))
    graph.update({1: KernelLaunch(prog, (b2, b1, bx), (n, 1, 1), vals=(-5,))})
    graph()
    gpu.synchronize()
    np.testing.assert_array_equal(_from_gpu(gpu, b2, out), (first + x) + f32(-5))


def test_transfers_on_one_gpu_and_between_gpus(gpu: CUDADevice) -> None:
    data = RNG.standard_normal(4096).astype(np.float32)
    src, dst = _to_gpu(gpu, data), _to_gpu(gpu, np.zeros_like(data))
    gpu.allocator._transfer(dst, src, data.nbytes, gpu, gpu)
    np.testing.assert_array_equal(_from_gpu(gpu, dst, data), data)
    from cuda.bindings import driver

    if driver.cuDeviceGetCount()[1] < 2:
        pytest.skip("transfers between GPUs need two of them; this machine has one")
    other = CUDADevice("CUDA:1")
    far = other.allocator.alloc(data.nbytes)
    other.allocator._transfer(far, src, data.nbytes, gpu, other)
    np.testing.assert_array_equal(_from_gpu(other, far, data), data)


def test_tensors_on_cuda_match_numpy(gpu: CUDADevice) -> None:
    lazygrad = pytest.importorskip("lazygrad", reason="needs the lazygrad frontend")
    a, b = RNG.standard_normal((33, 17)).astype(np.float32), RNG.standard_normal((17, 9)).astype(np.float32)
    ta, tb = lazygrad.Tensor(a, device="CUDA"), lazygrad.Tensor(b, device="CUDA")
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ta.exp() * 2).sum(axis=1).numpy(), (np.exp(a) * 2).sum(axis=1), rtol=1e-5)
    h = a.astype(np.float16)
    np.testing.assert_allclose(lazygrad.Tensor(h, device="CUDA").relu().numpy(), np.maximum(h, 0))
    # shapes the tensor cores tile (used where the GPU has them registered)
    x, y = RNG.integers(-3, 4, (64, 96)).astype(np.float16), RNG.integers(-3, 4, (96, 32)).astype(np.float16)
    got = (lazygrad.Tensor(x, device="CUDA").float() @ lazygrad.Tensor(y, device="CUDA").float()).numpy()
    np.testing.assert_array_equal(got, x.astype(np.float32) @ y.astype(np.float32))


def test_multi_device_suite_on_one_gpu_mapped_four_times(gpu: CUDADevice) -> None:
    """The frontend's multi-device suite (packages/frontend/tests/test_multi.py: sharding, all-reduces, gradients, the
    JIT, data- and model-parallel training, each against numpy and one device) on CUDA, CUDA:1, CUDA:2 and CUDA:3, all
    placed on GPU 0 by CUDA_GPUS, so their copies are device-to-device copies between four streams. In a fresh process:
    the placement is read when a device opens."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "CUDA_GPUS": "0,0,0,0", "MULTI_TEST_DEVICES": "CUDA,CUDA:1,CUDA:2,CUDA:3"}
    suite = root / "packages" / "frontend" / "tests" / "test_multi.py"
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", str(suite)]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_pipelined_matmul_in_dynamic_shared_memory_matches_numpy(gpu: CUDADevice) -> None:
    from lazygrad_codegen import Opt, OptOps, get_program
    from lazygrad_codegen.kernel_ast import matmul
    from lazygrad_cuda.renderer import CUDARenderer
    from lazygrad_cuda.tensor_cores import TENSOR_CORES

    # the default 128x128 tile of 4 warps with a 32-element step over 4 pipeline stages: more local memory than a
    # block declares statically, so launched with dynamic shared memory, alone and as a graph node; 12 reduce steps
    # wrap the 4 slots
    m, n, k = 256, 384, 384
    # the default tile's opts as a renderer of this architecture chooses them (the device opened here has no tensor
    # cores attached: the registry attaches them), with the 32-element step the default takes on long reductions
    arch = gpu.renderer.arch
    renderer = CUDARenderer(arch, TENSOR_CORES[arch])
    opts = [o for o in get_program(matmul(m, n, k, dtypes.float16), renderer).opts if o.op is not OptOps.UNROLL]
    assert opts[0].op is OptOps.TC and opts[-1].op is OptOps.STAGE, opts
    opts = [*opts[:-1], Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, None, 4)]
    spec = get_program(matmul(m, n, k, dtypes.float16), renderer, opts)
    prog = gpu.load_program(spec.name, gpu.compiler.compile(spec.src))
    assert prog.dynamic_shared > 48 * 1024, (spec.opts, prog.dynamic_shared)
    a, b = RNG.integers(-2, 3, (m, k)).astype(np.float16), RNG.integers(-2, 3, (k, n)).astype(np.float16)
    want = a.astype(np.float32) @ b.astype(np.float32)  # small integers: exact in any order of the sums
    out = np.zeros((m, n), np.float32)
    bufs = [_to_gpu(gpu, out), _to_gpu(gpu, a), _to_gpu(gpu, b)]
    prog(*bufs, global_size=spec.global_size, local_size=spec.local_size, wait=True)
    np.testing.assert_array_equal(_from_gpu(gpu, bufs[0], out), want)
    gpu.allocator.copyin(bufs[0], memoryview(out).cast("B"))
    CUDAGraph(gpu, [KernelLaunch(prog, tuple(bufs), spec.global_size, spec.local_size)])(wait=True)
    np.testing.assert_array_equal(_from_gpu(gpu, bufs[0], out), want)


def _wgmma_case(batch: int, m: int, n: int, k: int, dtype: DType, a_t: bool, b_t: bool):
    """A batched matmul kernel with A stored (b, m, k) or, `a_t`, (b, k, m) and B (b, k, n) or, `b_t`, (b, n, k), and
    small-integer inputs (exact sums in any order) with the float32 result numpy gives."""
    from lazygrad_codegen.kernel_ast import load as ast_load
    from lazygrad_codegen.kernel_ast import reduce, sink, st
    from lazygrad_codegen.kernel_ast import store as ast_store

    shape = (batch, m, n, k)
    a_view = st(batch, k, m, 1).permute((0, 2, 3, 1)) if a_t else st(batch, m, 1, k)
    b_view = st(batch, 1, n, k) if b_t else st(batch, 1, k, n).permute((0, 1, 3, 2))
    x, y = ast_load(1, dtype, a_view.expand(shape)), ast_load(2, dtype, b_view.expand(shape))
    prod = x.cast(dtypes.float32) * y.cast(dtypes.float32)
    ast = sink(ast_store(0, reduce(prod, Ops.ADD, (3,)), st(batch, m, n, 1)))
    a = RNG.integers(-2, 3, (batch, k, m) if a_t else (batch, m, k)).astype(np.float32)
    b = RNG.integers(-2, 3, (batch, n, k) if b_t else (batch, k, n)).astype(np.float32)
    want = (a.transpose(0, 2, 1) if a_t else a) @ (b.transpose(0, 2, 1) if b_t else b)
    stored = [_bf16_bits(v) if dtype == dtypes.bfloat16 else v.astype(np.float16) for v in (a, b)]
    return ast, stored, want


def _wgmma_probe(run, shape: tuple[int, int, int, int], dtype: DType, a_t: bool, b_t: bool) -> str:
    """Which element of A and of B a wrong matmul kernel read in place of each: `run(a, b)` runs it on stored
    inputs. A holding its own row (then column) index times a 0/1 B that picks column k of A into output column k
    shows, at C[m][k], the A element the hardware took for (m, k); the same for B with a 0/1 A. The first few
    misplaced elements of each operand are listed: what a layout fix needs to know."""
    batch, m, n, k = shape

    def stored(x: np.ndarray, transposed: bool) -> np.ndarray:
        x = x.transpose(0, 2, 1) if transposed else x
        return _bf16_bits(x) if dtype == dtypes.bfloat16 else x.astype(np.float16)

    lines = []
    eye_b = np.zeros((batch, k, n), np.float32)
    eye_a = np.zeros((batch, m, k), np.float32)
    for i in range(min(k, n)):
        eye_b[:, i, i] = 1
    for i in range(min(m, k)):
        eye_a[:, i, i] = 1
    # A: rows and columns of A read through B's 0/1 picks, C[:, :, :min(k, n)]
    rows_a = np.broadcast_to(np.arange(m, dtype=np.float32)[None, :, None], (batch, m, k)).copy()
    cols_a = np.broadcast_to(np.arange(k, dtype=np.float32)[None, None, :], (batch, m, k)).copy()
    got_r = run(stored(rows_a, a_t), stored(eye_b, b_t))[:, :, : min(k, n)]
    got_c = run(stored(cols_a, a_t), stored(eye_b, b_t))[:, :, : min(k, n)]
    bad = [
        f"A({i},{j}) read as A({int(got_r[0, i, j])},{int(got_c[0, i, j])})"
        for i in range(m)
        for j in range(min(k, n))
        if (got_r[0, i, j], got_c[0, i, j]) != (i, j)
    ]
    lines.append(f"A: {len(bad)} of {m * min(k, n)} misplaced; " + "; ".join(bad[:8]))
    rows_b = np.broadcast_to(np.arange(k, dtype=np.float32)[None, :, None], (batch, k, n)).copy()
    cols_b = np.broadcast_to(np.arange(n, dtype=np.float32)[None, None, :], (batch, k, n)).copy()
    got_r = run(stored(eye_a, a_t), stored(rows_b, b_t))[:, : min(m, k), :]
    got_c = run(stored(eye_a, a_t), stored(cols_b, b_t))[:, : min(m, k), :]
    bad = [
        f"B({i},{j}) read as B({int(got_r[0, i, j])},{int(got_c[0, i, j])})"
        for i in range(min(m, k))
        for j in range(n)
        if (got_r[0, i, j], got_c[0, i, j]) != (i, j)
    ]
    lines.append(f"B: {len(bad)} of {min(m, k) * n} misplaced; " + "; ".join(bad[:8]))
    return "\n".join(lines)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize(("a_t", "b_t"), [(False, False), (True, False), (False, True), (True, True)])
def test_wgmma_matmuls_match_numpy(gpu: CUDADevice, dtype: DType, a_t: bool, b_t: bool) -> None:
    """Hopper's wgmma (sm_90 only): the default wgmma tile (`WGMMA=1`) and others (each N, warpgroups and tiles per
    warpgroup, K steps of 16 to 64, one to four stages, padded shapes) give numpy's result exactly. The layouts are
    the PTX ISA's descriptor layouts as the PYTHON device emulates them; this is where the hardware confirms them."""
    _wgmma_matmuls(gpu, dtype, a_t, b_t, 1)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize(("a_t", "b_t"), [(False, False), (True, False), (False, True), (True, True)])
def test_tma_wgmma_matmuls_match_numpy(gpu: CUDADevice, dtype: DType, a_t: bool, b_t: bool) -> None:
    """The same with `WGMMA=2`: the pipelined unpadded tiles take their operands by the tensor memory accelerator
    (TMA). A test of its own, so that a run can take it apart from the cp.async one (a kernel that traps leaves the
    process's CUDA context unusable)."""
    _wgmma_matmuls(gpu, dtype, a_t, b_t, 2)


def _wgmma_matmuls(gpu: CUDADevice, dtype: DType, a_t: bool, b_t: bool, level: int) -> None:
    from lazygrad_codegen import Kernel, Opt, OptOps, get_program
    from lazygrad_codegen.heuristic import hand_coded_optimizations
    from lazygrad_cuda.renderer import CUDARenderer
    from lazygrad_cuda.tensor_cores import TENSOR_CORES
    from lazygrad_uop.config import Context

    if gpu.renderer.arch != "sm_90":
        pytest.skip(f"wgmma is an sm_90 instruction; this GPU is {gpu.renderer.arch}")
    renderer = CUDARenderer("sm_90", TENSOR_CORES["sm_90"])
    select = {
        tc.dims[0]: i for i, tc in enumerate(renderer.tensor_cores) if tc.shared_operands and tc.dtype_in == dtype
    }
    cases: list[tuple[tuple[int, int, int, int], list[Opt] | None]] = [
        ((1, 256, 512, 256), None),  # the default tile (two warpgroups of 64x256, 64-element steps, 4 stages)
        (
            (2, 128, 128, 192),
            [
                Opt(OptOps.TC, 0, (select[128], 0)),
                Opt(OptOps.UPCAST, 0, 2),
                Opt(OptOps.UNROLL, 0, 4),
                Opt(OptOps.STAGE, None, 3),
            ],
        ),
        (
            (1, 128, 64, 96),
            [
                Opt(OptOps.TC, 0, (select[64], 0)),
                Opt(OptOps.LOCAL, 0, 2),
                Opt(OptOps.UNROLL, 0, 2),
                Opt(OptOps.STAGE, None, 2),
            ],
        ),
        ((1, 64, 128, 48), [Opt(OptOps.TC, 0, (select[128], 0)), Opt(OptOps.STAGE, None, 1)]),
        ((1, 100, 72, 96), [Opt(OptOps.TC, 0, (select[64], 1)), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE)]),
    ]
    for n, (shape, opts) in enumerate(cases):
        ast, (a, b), want = _wgmma_case(*shape, dtype, a_t, b_t)
        with Context(WGMMA=level):
            if opts is None:
                opts = hand_coded_optimizations(Kernel(ast, renderer)).applied_opts
            spec = get_program(ast, renderer, opts)
        assert "wgmma.mma_async" in spec.src, (shape, spec.opts)
        # the pipelined tiles of whole tensors (the first three) on the tensor memory accelerator with WGMMA=2
        assert ("cp.async.bulk.tensor" in spec.src) == (level == 2 and n < 3), (shape, spec.opts)
        prog = gpu.load_program(spec.name, gpu.compiler.compile(spec.src))

        def run(a_stored: np.ndarray, b_stored: np.ndarray, prog=prog, spec=spec, shape=want.shape) -> np.ndarray:
            out = np.zeros(shape, np.float32)
            bufs = [_to_gpu(gpu, out), _to_gpu(gpu, a_stored), _to_gpu(gpu, b_stored)]
            prog(*bufs, global_size=spec.global_size, local_size=spec.local_size, wait=True)
            return _from_gpu(gpu, bufs[0], out)

        got = run(a, b)
        if not np.array_equal(got, want):
            probe = _wgmma_probe(run, shape, dtype, a_t, b_t)
            pytest.fail(f"{shape} {spec.opts} WGMMA={level}: wrong result; what the hardware read:\n{probe}")
