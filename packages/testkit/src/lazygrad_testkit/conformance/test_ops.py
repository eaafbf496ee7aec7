"""Every case of the op suite on the device under test, against its numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_testkit.op_suite import CASES, OpCase
from lazygrad_uop.dtype import PtrDType


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_op_suite_case_matches_numpy(case: OpCase, lazygrad_device: str, lazygrad_skip_dtypes: frozenset) -> None:
    out, ref, tol = case.build(lazygrad_device)
    used = {u.dtype.scalar() for u in out.uop.toposort if not isinstance(u.dtype, PtrDType)}
    if lacking := used & lazygrad_skip_dtypes:
        pytest.skip(f"{case.name} uses {sorted(dt.name for dt in lacking)}, which {lazygrad_device} doesn't have")
    got = out.numpy()
    assert got.shape == ref.shape, f"{case.name}: shape {got.shape}, numpy's {ref.shape}"
    np.testing.assert_allclose(got, ref, **tol, err_msg=case.name)
