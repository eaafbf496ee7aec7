"""lazy_exports: names resolve to their module's objects on first use, and only then is the module imported."""

from __future__ import annotations

import sys

import pytest

from lazygrad_uop.lazy_exports import lazy_exports


def test_names_import_their_module_on_first_use() -> None:
    sys.modules.pop("colorsys", None)
    names, getattr_ = lazy_exports("fake_pkg", {"rgb_to_hsv": "colorsys", "dedent": "textwrap"})
    assert names == ["dedent", "rgb_to_hsv"]
    assert "colorsys" not in sys.modules
    import colorsys  # the reference: the module's own function

    assert getattr_("rgb_to_hsv") is colorsys.rgb_to_hsv
    with pytest.raises(AttributeError, match="module 'fake_pkg' has no attribute 'nope'"):
        getattr_("nope")
