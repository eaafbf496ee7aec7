"""examples/train_digits_dp.py: data-parallel training on two in-process devices follows the loss curve of one
device with the same global batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_two_devices_follow_the_one_device_loss_curve(load_example, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sklearn")
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the example imports the model from train_digits.py
    example = load_example("train_digits_dp")
    one = example.train_in_process(None, steps=3, batch_size=32)
    two = example.train_in_process(("CPU:0", "CPU:1"), steps=3, batch_size=32)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5, atol=1e-6)
    assert abs(two["accuracy"] - one["accuracy"]) <= 1 / 449  # one test image may flip on a rounding difference
