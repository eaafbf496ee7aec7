"""TMA tensor maps: the table a kernel's binary carries (`compiler.tensor_maps`, read from NVRTC's cubin and PTX), the
`CUtensorMap` parameters a launch encodes from it over its buffers (`KernelArgs`, `CUDAProgram`, `CUDAGraph`, against
the stand-in driver of `fake_cuda`), and a TMA copy on a real Hopper GPU (skipped elsewhere, saying why)."""

from __future__ import annotations

import ctypes
import gc
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from cuda.bindings import driver as real_driver
from cuda_helpers import has_nvrtc
from fake_cuda import FakeDriver, driver_missing, install, stand_in_tensor_map

from lazygrad_cuda import device, graph
from lazygrad_cuda.compiler import TensorMapArg, tensor_maps
from lazygrad_cuda.errors import CUDAError
from lazygrad_cuda.program import KernelArgs
from lazygrad_cuda.renderer import TENSOR_MAPS_SYMBOL
from lazygrad_uop.device import KernelLaunch

no_driver = pytest.mark.skipif(
    not driver_missing(), reason="a CUDA driver is installed: the GPU test runs these calls for real"
)

FLOAT16, FLOAT32 = 6, 7  # CUtensorMapDataType values
# buffer, dtype, rank, swizzle, offset, dims 0-4, strides 0-4 (bytes), box 0-4
HALF_3D = [1, FLOAT16, 3, 128, 32, 64, 48, 5, 1, 1, 2, 128, 6144, 0, 0, 64, 8, 1, 1, 1]
FLOAT_1D = [0, FLOAT32, 1, 0, 0, 1000, 1, 1, 1, 1, 4, 0, 0, 0, 0, 256, 1, 1, 1, 1]
WANT = (
    TensorMapArg(
        buffer=1, dtype=FLOAT16, swizzle=128, offset=32, dims=(64, 48, 5), strides=(128, 6144), box=(64, 8, 1)
    ),
    TensorMapArg(buffer=0, dtype=FLOAT32, swizzle=0, offset=0, dims=(1000,), strides=(), box=(256,)),
)


needs_nvrtc = pytest.mark.skipif(not has_nvrtc(), reason="needs NVRTC to compile the kernel")


def _table_src(words: list[int]) -> str:
    """A kernel whose module declares `words` as the tensor map table, as the renderer does (the kernel reads it, so
    no compiler could drop it)."""
    init = ", ".join(map(str, words))
    return (
        f"__constant__ unsigned long long {TENSOR_MAPS_SYMBOL}[{len(words)}] = {{{init}}};\n"
        f'extern "C" __global__ void k(unsigned long long* out) {{ out[0] = {TENSOR_MAPS_SYMBOL}[0]; }}\n'
    )


def _binaries(words: list[int]) -> dict[str, bytes]:
    """The sm_90 cubin and the compute_90 PTX (NUL-terminated, as `NVRTCCompiler` returns it) of `_table_src`."""
    from lazygrad_cuda.compiler import nvrtc_compile

    cubin = nvrtc_compile(_table_src(words), "sm_90", "k").cubin
    assert cubin is not None and cubin[:4] == b"\x7fELF"
    return {"cubin": cubin, "ptx": nvrtc_compile(_table_src(words), "compute_90", "k").ptx.rstrip(b"\0") + b"\0"}


@needs_nvrtc
def test_the_table_is_read_from_cubin_and_ptx() -> None:
    for kind, lib in _binaries([2, *HALF_3D, *FLOAT_1D]).items():
        assert tensor_maps(lib) == WANT, kind
    # NVRTC writes the u64 array as bytes in PTX, the trailing zero ones left out
    ptx = _binaries([2, *HALF_3D, *FLOAT_1D])["ptx"]
    assert f".const .align 8 .b8 {TENSOR_MAPS_SYMBOL}[{8 * 41}] = {{2, 0, 0, 0, 0, 0, 0, 0, 1, 0,".encode() in ptx
    assert WANT[0].rank == 3 and WANT[1].rank == 1


@needs_nvrtc
def test_no_table_is_no_maps() -> None:
    src = 'extern "C" __global__ void k(float* out) { out[0] = 1.0f; }'
    from lazygrad_cuda.compiler import nvrtc_compile

    assert tensor_maps(nvrtc_compile(src, "sm_90", "k").cubin or b"") == ()
    assert tensor_maps(nvrtc_compile(src, "compute_90", "k").ptx) == ()
    # a count of zero: NVRTC writes the all-zero array without an initializer
    for kind, lib in _binaries([0]).items():
        assert tensor_maps(lib) == (), kind


@needs_nvrtc
@pytest.mark.parametrize(
    ("words", "match"),
    [
        ([2, *HALF_3D], r"count \(2\)"),
        ([1, *HALF_3D, *FLOAT_1D], r"count \(1\)"),
        ([0, 0, 0], r"count \(0\)"),
        ([1, *HALF_3D[:2], 6, *HALF_3D[3:]], "rank 6"),
        ([1, *HALF_3D[:2], 0, *HALF_3D[3:]], "rank 0"),
        ([1, *HALF_3D[:3], 16, *HALF_3D[4:]], "swizzles 16 bytes"),
    ],
)
def test_a_malformed_table_is_an_error_saying_what_is_wrong(words: list[int], match: str) -> None:
    for lib in _binaries(words).values():
        with pytest.raises(ValueError, match=match):
            tensor_maps(lib)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    yield install(monkeypatch)
    # objects of this test (a graph kept alive by a traceback) go while this stand-in still answers for the driver
    gc.collect()


@dataclass(frozen=True)
class _Buffer:
    """All `KernelArgs` reads of a buffer: its device address."""

    ptr: int


def _expected_map(m: TensorMapArg, address: int) -> bytes:
    return stand_in_tensor_map(address, m.dtype, list(m.dims), list(m.strides), list(m.box))


@no_driver
def test_kernel_args_encode_each_map_after_the_buffers_and_ints(fake: FakeDriver) -> None:
    bufs = [_Buffer(0x7F0000001000), _Buffer(0x7F0000200000)]
    args = KernelArgs(bufs, [5, -3], WANT, "k")
    calls = fake.args_of("cuTensorMapEncodeTiled")
    assert len(calls) == 2
    d = real_driver
    modes = (
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    swizzles = (d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE)
    dtypes = (
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    )
    addresses = (0x7F0000200000 + 32, 0x7F0000001000)
    ranks, dims, strides, box = (3, 1), ([64, 48, 5], [1000]), ([128, 6144], []), ([64, 8, 1], [256])
    for i, call in enumerate(calls):
        dtype, rank, address, g_dims, g_strides, g_box, element_strides, interleave, swizzle, l2, oob = call
        assert (dtype, rank, int(address), swizzle) == (dtypes[i], ranks[i], addresses[i], swizzles[i])
        assert [int(x) for x in g_dims] == dims[i] and [int(x) for x in g_strides] == strides[i]
        assert [int(x) for x in g_box] == box[i] and [int(x) for x in element_strides] == [1] * ranks[i]
        assert (interleave, l2, oob) == modes
    # the pointer array: 2 buffers, 2 ints, 2 maps in 64-byte aligned memory the kernel object owns
    ptrs = (ctypes.c_void_p * 6).from_address(args.address)
    assert [ctypes.c_uint64.from_address(p).value for p in ptrs[:2]] == [b.ptr for b in bufs]
    assert [ctypes.c_int32.from_address(p).value for p in ptrs[2:4]] == [5, -3]
    for i, p in enumerate(ptrs[4:]):
        assert p % 64 == 0 and ctypes.string_at(p, 128) == _expected_map(WANT[i], addresses[i])
    # no maps: nothing to encode
    KernelArgs(bufs, [1])
    assert fake.args_of("cuTensorMapEncodeTiled") == calls


@no_driver
def test_a_map_the_driver_refuses_is_an_error_naming_it(fake: FakeDriver) -> None:
    fake.fail["cuTensorMapEncodeTiled"] = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(
        CUDAError,
        match=r"tensor map 0 of k: .*FLOAT16, dims \(64, 48, 5\), byte strides "
        r"\(128, 6144\), box \(64, 8, 1\), swizzle 128 bytes, address 0x1020 \(buffer 1 \+ 32 bytes\)\)",
    ):
        KernelArgs([_Buffer(0x100), _Buffer(0x1000)], [], WANT, "k")
    misaligned = TensorMapArg(0, FLOAT32, 0, 8, (1000,), (), (256,))
    fake.fail["cuTensorMapEncodeTiled"] = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CUDAError, match=r"address 0x108 \(buffer 0 \+ 8 bytes, not 16-byte aligned\)"):
        KernelArgs([_Buffer(0x100)], [], [misaligned], "k")
    with pytest.raises(ValueError, match="tensor map 0 of k views buffer 1, but the launch passes 1 buffers"):
        KernelArgs([_Buffer(0x100)], [], WANT, "k")
    with pytest.raises(ValueError, match="data type 99, which is no CUtensorMapDataType"):
        KernelArgs([_Buffer(0x100)], [], [TensorMapArg(0, 99, 0, 0, (1000,), (), (256,))], "k")


def _ptx_table(words: list[int]) -> bytes:
    """A stand-in PTX module with a tensor map table written as NVRTC writes it (see the test of reading it)."""
    data = b"".join(w.to_bytes(8, "little") for w in words).rstrip(b"\0")
    init = ", ".join(str(b) for b in data)
    return f".const .align 8 .b8 {TENSOR_MAPS_SYMBOL}[{8 * len(words)}] = {{{init}}};\n".encode() + b"\0"


@no_driver
def test_a_program_launches_with_maps_of_its_buffers_encoded_once_per_buffers(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.load_program("k", _ptx_table([2, *HALF_3D, *FLOAT_1D]))
    assert prog.tensor_maps == WANT
    a, b, c = (gpu.allocator.alloc(4096) for _ in range(3))
    fake.param_shape, fake.param_maps = (2, 1), 2
    prog(a, b, vals=(7,))
    prog(a, b, vals=(7,))
    assert len(fake.args_of("cuTensorMapEncodeTiled")) == 2  # the second launch reuses the first's arguments
    prog(a, c, vals=(7,))
    assert len(fake.args_of("cuTensorMapEncodeTiled")) == 4
    assert fake.kernel_args[-1] == ([a.ptr, c.ptr], [7])
    assert fake.kernel_maps[-3:] == [
        [_expected_map(WANT[0], b.ptr + 32), _expected_map(WANT[1], a.ptr)],
        [_expected_map(WANT[0], b.ptr + 32), _expected_map(WANT[1], a.ptr)],
        [_expected_map(WANT[0], c.ptr + 32), _expected_map(WANT[1], a.ptr)],
    ]


@no_driver
def test_graph_nodes_get_maps_of_their_buffers_and_updates_new_ones(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.load_program("k", _ptx_table([1, *HALF_3D]))
    a, b, c = (gpu.allocator.alloc(4096) for _ in range(3))
    fake.param_shape, fake.param_maps = (2, 0), 1
    g = graph.CUDAGraph(gpu, [KernelLaunch(prog, (a, b)), KernelLaunch(prog, (b, c))])
    assert fake.kernel_maps == [[_expected_map(WANT[0], b.ptr + 32)], [_expected_map(WANT[0], c.ptr + 32)]]
    g.update({1: KernelLaunch(prog, (b, a))})
    assert fake.kernel_maps[-1] == [_expected_map(WANT[0], a.ptr + 32)]


# *** on a real GPU ***

TILE_SRC = """struct __align__(64) lg_tensor_map { unsigned long long v[16]; };
__constant__ unsigned long long lg_tensor_maps[21] = {1,
  1, 7, 2, 0, 16, 24, 20, 1, 1, 1, 4, 128, 0, 0, 0, 16, 8, 1, 1, 1};
extern "C" __global__ void __launch_bounds__(128, 1) tma_tile(float* data0, const float* data1, int x0, int y0,
                                                            const __grid_constant__ lg_tensor_map tmap0) {
  __shared__ __align__(128) float tile[8 * 16];
  __shared__ __align__(8) unsigned long long bar;
  unsigned bar_s = (unsigned)__cvta_generic_to_shared(&bar), tile_s = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_s) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // the copy's completion sees the init
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar_s), "r"(8 * 16 * 4) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(tile_s), "l"((unsigned long long)&tmap0), "r"(x0), "r"(y0), "r"(bar_s) : "memory");
  }
  asm volatile("{\\n.reg .pred done;\\nWAIT:\\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\\n"
               "@!done bra WAIT;\\n}" :: "r"(bar_s) : "memory");
  for (int i = threadIdx.x; i < 8 * 16; i += 128) data0[i] = tile[i];
}
"""
"""One TMA copy of a 16x8 float box at (x0, y0) of a 24x20 tensor that starts 16 bytes into data1, rows 32 floats
apart (the table has 20 words after the count, one map), to data0."""


def _tile_reference(data: np.ndarray, x0: int, y0: int) -> np.ndarray:
    """The box at (x0, y0) of the 24x20 view of `data` (rows of 32 floats from element 4), zeros outside it."""
    view = data[4 : 4 + 20 * 32].reshape(20, 32)[:, :24]
    out = np.zeros((8, 16), np.float32)
    for y in range(8):
        for x in range(16):
            if 0 <= y0 + y < 20 and 0 <= x0 + x < 24:
                out[y, x] = view[y0 + y, x0 + x]
    return out


@needs_nvrtc
def test_the_gpu_test_kernel_compiles_for_sm_90() -> None:
    from lazygrad_cuda.compiler import nvrtc_compile

    out = nvrtc_compile(TILE_SRC, "sm_90", "tma_tile")
    assert out.cubin is not None and tensor_maps(out.cubin) == (
        TensorMapArg(buffer=1, dtype=FLOAT32, swizzle=0, offset=16, dims=(24, 20), strides=(128,), box=(16, 8)),
    )


def test_tma_copies_boxes_of_launch_and_graph_buffers(gpu) -> None:
    from lazygrad_cuda.graph import CUDAGraph

    if int(re.sub(r"\D", "", gpu.arch)) < 90:
        pytest.skip(f"TMA (cp.async.bulk.tensor) needs sm_90 or newer; this GPU is {gpu.arch}")
    prog = gpu.load_program("tma_tile", gpu.compiler.compile(TILE_SRC))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(4 + 20 * 32).astype(np.float32) for _ in range(2)]
    srcs = []
    for data in inputs:
        srcs.append(gpu.allocator.alloc(data.nbytes))
        gpu.allocator.copyin(srcs[-1], memoryview(data).cast("B"))
    out = gpu.allocator.alloc(8 * 16 * 4)

    def result() -> np.ndarray:
        got = np.empty((8, 16), np.float32)
        gpu.allocator.copyout(memoryview(got).cast("B"), out)
        return got

    for x0, y0 in [(0, 0), (16, 16), (-8, 3)]:  # inside, over the far corner, over the near edge
        prog(out, srcs[0], local_size=(128, 1, 1), vals=(x0, y0), wait=True)
        np.testing.assert_array_equal(result(), _tile_reference(inputs[0], x0, y0))
    g = CUDAGraph(gpu, [KernelLaunch(prog, (out, srcs[0]), (1, 1, 1), (128, 1, 1), (8, 4))])
    g(wait=True)
    np.testing.assert_array_equal(result(), _tile_reference(inputs[0], 8, 4))
    g.update({0: KernelLaunch(prog, (out, srcs[1]), (1, 1, 1), (128, 1, 1), (8, 4))})
    g(wait=True)
    np.testing.assert_array_equal(result(), _tile_reference(inputs[1], 8, 4))
