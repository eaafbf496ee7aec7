"""The graph-runner contract on the device under test, where the device has a graph type."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lazygrad_testkit.graph_contract import CHECKS, GraphHarness, check_jit_replays_through_the_graph, harness_for
from lazygrad_uop.registry import Device


def _harness(device: str) -> GraphHarness:
    dev = Device[device]
    if dev.graph is None:
        pytest.skip(f"{device} has no graph type (the JIT runs its kernels one by one)")
    return harness_for(device)


def _contract_harness(device: str) -> GraphHarness:
    harness = _harness(device)
    try:
        harness.program("lg_contract_probe")
    except NotImplementedError as exc:  # a renderer whose kernels loop over everything has no launch index
        pytest.skip(f"the contract's kernel indexes by its launch, which {device}'s renderer can't render: {exc}")
    return harness


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_graph_contract(check: Callable[[GraphHarness], None], lazygrad_device: str) -> None:
    check(_contract_harness(lazygrad_device))


def test_jit_replays_through_the_graph(lazygrad_device: str) -> None:
    _harness(lazygrad_device)
    check_jit_replays_through_the_graph(lazygrad_device)
