"""The README's demo: examples/train_digits.py trains its conv net to at least 97% test accuracy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_digits.py"


def test_digits_reach_97_percent() -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    if not EXAMPLE.exists():
        pytest.skip(f"{EXAMPLE} is not in this checkout")
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    _, accuracy = example.train(progress=False)
    assert accuracy >= 0.97, f"test accuracy {accuracy:.4f} is below 97%"
