"""The MSL check itself: the declarations in msl_header/ accept Metal the renderer writes and reject what Metal
would reject, so a kernel that passes the op suite's check is not passing by accident."""

from __future__ import annotations

from pathlib import Path

import pytest
from msl_check import check_msl, cxx

pytestmark = pytest.mark.skipif(cxx() is None, reason="no C++ compiler (c++) on PATH")

KERNEL = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* data0 [[buffer(0)]], device half* data1 [[buffer(1)]], constant int& n [[buffer(2)]],
              uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int gidx0 = gid.x;
  BODY
}
"""


def test_metal_the_renderer_writes_passes(tmp_path: Path) -> None:
    body = "threadgroup float t[4]; half h = (*(data1+gidx0)); t[lid.x] = exp2(((float)(h)));"
    body += " threadgroup_barrier(mem_flags::mem_threadgroup); bfloat b = ((bfloat)(t[0]));"
    body += " (*(data0+gidx0)) = ((float)(b)) + as_type<float>(n) + sqrt(float4(1.0f)).x;"
    check_msl([KERNEL.replace("BODY", body)], tmp_path)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("(*(data0+gidx0)) = exp2f(1.0f);", "C's f-suffixed math: Metal overloads exp2"),
        ("double d = 1.0; (*(data0+gidx0)) = d;", "no doubles on Apple GPUs"),
        ("bfloat b = ((bfloat)(1.0f)); (*(data0+gidx0)) = b + 1.0f;", "bfloat converts only explicitly"),
        ("(*(data0+gidx0)) = as_type<float>(*(data1+gidx0));", "as_type between types of different sizes"),
        ("(*(data0+gidx0)) = fmax(1.0f, 2.0f);", "a builtin the header doesn't declare"),
        ("int unused = 3;", "warnings are errors"),
    ],
    ids=lambda x: x if len(x) < 40 else None,
)
def test_what_metal_rejects_fails(tmp_path: Path, body: str, why: str) -> None:
    with pytest.raises(AssertionError, match="doesn't compile"):
        check_msl([KERNEL.replace("BODY", body)], tmp_path)


def test_unknown_attributes_fail(tmp_path: Path) -> None:
    src = KERNEL.replace("uint3 lid [[thread_position_in_threadgroup]]", "uint lid [[thread_index_in_simdgroup]]")
    with pytest.raises(AssertionError, match="attribute"):
        check_msl([src.replace("BODY", "")], tmp_path)
