"""The README's demo: examples/train_digits.py trains its conv net to at least 97% test accuracy."""

from __future__ import annotations

import pytest


def test_digits_reach_97_percent(load_example) -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    example = load_example("train_digits")
    _, accuracy = example.train(progress=False)
    assert accuracy >= 0.97, f"test accuracy {accuracy:.4f} is below 97%"
