"""Shared fixtures: the op suite runs on every device given here, each checked against numpy."""

from __future__ import annotations

import pytest
from hypothesis import settings

from lazygrad_uop.registry import Device

settings.register_profile("ops", max_examples=12, deadline=None, derandomize=True)
settings.load_profile("ops")

OP_DEVICES = ["CPU", "PYTHON", "CL", "CUDA"]


@pytest.fixture(params=OP_DEVICES, scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """Each device of the op suite, skipped where this machine can't run it."""
    why = Device.usable(request.param) if request.param in Device.installed() else "not installed"
    if why is not None:
        pytest.skip(f"{request.param} device unavailable: {why}")
    return request.param
