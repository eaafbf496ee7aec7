"""The incremental fusion rounds of `choose_realized` decide exactly what the plain algorithm decides: every round,
collect every group afresh, count the groups sharing each node, and scan the whole graph from the outputs down for
the first shared node worth storing (one node per round, where the rounds store one per device). The plain algorithm
is written out here, on random graphs, on a model and on a model trained on several devices."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from test_kernelize import Graph, graphs

from lazygrad_scheduler.placement import reads_in_place
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.shape import shape_of
from lazygrad_uop.uop import UOp

# the module, not the package's `kernelize` function of the same name
kz = importlib.import_module("lazygrad_scheduler.kernelize")


def plain_choose_realized(outputs: list[UOp]) -> tuple[set[UOp], dict[UOp, kz._Group]]:
    """`choose_realized` without any incremental bookkeeping: each round recomputes everything."""
    sink = UOp(Ops.SINK, src=tuple(outputs))
    order = list(sink.toposort)
    realized = {kz.output_root(o) for o in outputs if not kz.is_view_of_leaf(o)}
    for u in order:
        if u.op is Ops.CONTIGUOUS or (u.op is Ops.ASSIGN and not kz.is_kernelized(u)):
            realized.add(u)
        if u.op is Ops.COPY and reads_in_place(u):
            if not kz.is_view_of_leaf(u.src[1]):
                realized.add(kz.output_root(u.src[1]))
        elif u.op is Ops.COPY:
            realized.add(u)
            if not kz._is_whole_leaf(u.src[1]):
                realized.add(u.src[1])
    realized |= {u.src[1] for u in realized if u.op is Ops.ASSIGN and kz._reads_target_elsewhere(u)}
    constant: set[UOp] = set()
    for u in order:
        if u.op is Ops.CONST or (
            u.op in GroupOp.Elementwise | kz.MOVEMENT | kz.PASSTHROUGH and all(s in constant for s in u.src)
        ):
            constant.add(u)
    while True:
        must: set[UOp] = set()
        groups = {r: kz._collect(r, realized, must, constant) for r in realized if not kz._byte_copy(r)}
        if must - realized:
            realized |= must
            continue
        owners: dict[UOp, list[kz._Group]] = {}
        for g in groups.values():
            for m in g.members:
                owners.setdefault(m, []).append(g)
        added = None
        pos = {n: i for i, n in enumerate(order)}
        for u in reversed(order):
            gs = owners.get(u, [])
            if len(gs) < 2 or u in realized or u.op in kz.MOVEMENT:
                continue
            if any(n.op is Ops.REDUCE_AXIS for n in kz._fused_nodes(u, realized)):
                added = kz._shared_reduction_root(u, gs, owners, realized, pos)
                break
            k = len(gs)
            stored = kz.max_numel(shape_of(u)) * u.dtype.itemsize
            recompute = sum(kz._bytes_read(u, g) for g in gs)
            # (the kernel that would store it: a launch's worth of bytes)
            if stored * (k + 1) + recompute // k + kz.LAUNCH_OPS // kz.OPS_PER_BYTE < recompute:
                added = u
                break
        if added is None:
            return realized, groups
        realized.add(added)


def same_decisions(outputs: list[UOp]) -> None:
    fast_realized, fast_groups = kz.choose_realized(outputs)
    realized, groups = plain_choose_realized(outputs)
    assert fast_realized == realized
    assert fast_groups.keys() == groups.keys()
    for r, g in groups.items():
        f = fast_groups[r]
        assert (f.members, f.leaves, f.reduce_sig) == (g.members, g.leaves, g.reduce_sig)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_decide_the_same(graph: Graph) -> None:
    same_decisions(graph.outputs)


@pytest.mark.parametrize("devices", [None, ("CPU", "CPU:1", "CPU:2"), ("PYTHON", "PYTHON:1")])
def test_a_training_step_decides_the_same(devices: tuple[str, ...] | None) -> None:
    """A conv net's forward and backward: many rounds, reductions shared by forward and backward; on one device, and
    data parallel on devices that read each other's memory in place (CPU) or copy (PYTHON)."""
    import numpy as np

    lazygrad = pytest.importorskip("lazygrad")
    from lazygrad.multi import device_uops
    from lazygrad.nn.state import get_parameters

    tensor, nn = lazygrad.Tensor, lazygrad.nn
    tensor.manual_seed(0)
    conv1, conv2, fc = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 10)
    params = get_parameters([conv1, conv2, fc])
    for p in params:
        p.requires_grad = True
        if devices is not None:
            p.shard_(devices)
    tensor.realize(*params)
    rng = np.random.default_rng(0)
    x, y = tensor(rng.random((6, 1, 8, 8), dtype=np.float32)), tensor(rng.integers(0, 10, 6).astype(np.int32))
    if devices is not None:
        x, y = x.shard(devices, 0), y.shard(devices, 0)
    with tensor.train():
        loss = fc(conv2(conv1(x).relu()).relu().max_pool2d(2).flatten(1)).sparse_categorical_crossentropy(y)
        loss.backward()
    grads = [p.grad.uop for p in params if p.grad is not None]
    assert len(grads) == len(params)
    # a tensor on several devices is realized as its parts, one per device
    same_decisions([part for u in (loss.uop, *grads) for part in device_uops(u)])
