"""Tensors on several devices: sharded along one axis, or replicated (tinygrad's `Tensor.shard` semantics).

Such a tensor's graph node is a MULTI: one source per device, each that device's part, and as arg the axis the
parts are concatenated along (None: every device holds the whole value). An op on MULTI nodes is pushed down to
the parts as soon as it is built (`lower_multi`, a set of rewrite rules), so the graph under a MULTI is made of
ordinary single-device graphs joined by COPY nodes: the scheduler, the code generator, autograd and the JIT see
nothing new. What needs more than one op per part:

- parts sharded along different axes (or one sharded, one replicated) are brought to one axis first: a replicated
  value is cut down to each device's part (a free view), a value sharded along another axis is re-sharded (each
  device copies in the pieces it needs from every other);
- a reduction across the sharded axis is a partial reduction per device and an all-reduce (`all_reduce`): direct
  (each device adds every other's partial, in one order so the copies agree bit for bit) for small tensors, a ring
  (reduce-scatter, then all-gather, moving 2(n-1)/n of the bytes per device) for large ones between devices that
  copy bytes; devices that read each other's memory always go direct (see `ring_chosen`). Devices that share the
  host's memory (CPU:0, CPU:1, ...) read each other's buffers in place (the scheduler turns a COPY between them into a
  load), so there no bytes are copied: the direct all-reduce is one kernel per device that reads every partial where
  it lies, and the ring a reduce-scatter kernel per chunk (each element added once) and one gathering kernel per
  device;
- movement ops that cut or reorder the sharded axis (a pad or shrink of it, a reshape that splits it unevenly)
  gather the value on every device first (the result is replicated), a flip of it reverses the order of the parts;
- autograd of a replicated target sums its parts' gradients (an all-reduce): data-parallel training's gradient
  averaging falls out of the graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lazygrad.errors import InputError
from lazygrad.gradient import compute_gradient
from lazygrad_uop.config import ContextVar
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, UPat
from lazygrad_uop.registry import shares_host_memory
from lazygrad_uop.shape import device_of, shape_of
from lazygrad_uop.uop import UOp

# all-reduces of at most this many bytes per device go direct (one step, n-1 whole copies per device); larger ones
# take the ring, which moves less per device and splits the additions among the devices (settable with Context)
RING_MIN_BYTES = ContextVar("RING_MIN_BYTES", 256 * 1024)


class MultiDeviceError(ValueError):
    """Tensors on different sets of devices (or on several devices and on one) were combined."""


# *** building MULTI nodes ***


def is_multi(u: UOp) -> bool:
    """Whether `u` is a tensor on several devices."""
    return u.op is Ops.MULTI


def device_uops(u: UOp) -> tuple[UOp, ...]:
    """The single-device nodes of `u`: its parts if it is a MULTI, else `u` itself."""
    return u.src if u.op is Ops.MULTI else (u,)


def multi(parts: Sequence[UOp], axis: int | None) -> UOp:
    """The MULTI of `parts` (one per device, in device order) concatenated along `axis` (None: replicated)."""
    devices = [device_of(p) for p in parts]
    if len(set(devices)) != len(devices) or any(not isinstance(d, str) for d in devices):
        raise MultiDeviceError(f"the parts of a tensor on several devices must be on distinct devices, got {devices}")
    return UOp(Ops.MULTI, parts[0].dtype, tuple(parts), axis)


def _devices(u: UOp) -> tuple[str, ...]:
    return tuple(device_of(s) for s in u.src)  # type: ignore[misc]


def _copy(u: UOp, device: str) -> UOp:
    return u if device_of(u) == device else UOp(Ops.COPY, u.dtype, (UOp(Ops.DEVICE, arg=device), u))


def _shrink_axis(u: UOp, axis: int, start: int, end: int) -> UOp:
    shape = shape_of(u)
    if (start, end) == (0, shape[axis]):
        return u
    return UOp(Ops.SHRINK, u.dtype, (u,), tuple((start, end) if i == axis else (0, d) for i, d in enumerate(shape)))


def _pad_axis(u: UOp, axis: int, before: int, after: int) -> UOp:
    if before == after == 0:
        return u
    shape = shape_of(u)
    return UOp(Ops.PAD, u.dtype, (u,), tuple((before, after) if i == axis else (0, 0) for i in range(len(shape))))


def _concat(parts: Sequence[UOp], axis: int) -> UOp:
    """`parts` (on one device) joined along `axis`: each padded to the whole, each later one selected over what came
    before in its own range, which a kernel fuses into one pass that reads each part where it lies. (Summing
    zero-padded parts would turn -0.0 into +0.0.)"""
    sizes = [shape_of(p)[axis] for p in parts]
    total, out, start = sum(sizes), None, 0
    for p, n in zip(parts, sizes):
        padded = _pad_axis(p, axis, start, total - start - n)
        if out is None:
            out = padded
        else:
            inside = _pad_axis(_full_like(p, True, dtypes.bool), axis, start, total - start - n)
            out = UOp(Ops.WHERE, out.dtype, (inside, padded, out))
        start += n
    assert out is not None
    return out


def shard(u: UOp, devices: Sequence[str], axis: int | None) -> UOp:
    """The single-device value `u` on `devices`: split into equal parts along `axis`, or replicated (None)."""
    if axis is None:
        return multi([_copy(u, d) for d in devices], None)
    size, n = shape_of(u)[axis], len(devices)
    if not isinstance(size, int) or size % n:
        raise InputError(
            f"can't shard axis {axis} of size {size} evenly over {n} devices; pad it to a multiple of {n}, shard "
            "another axis, or replicate (axis=None)"
        )
    k = size // n
    return multi([_copy(_shrink_axis(u, axis, i * k, (i + 1) * k), d) for i, d in enumerate(devices)], axis)


def gather(u: UOp, device: str) -> UOp:
    """The whole value of MULTI `u` on one device: a replicated one's copy (the one on `device` if there is one),
    a sharded one's parts copied there and concatenated."""
    if u.arg is None:
        for p in u.src:
            if device_of(p) == device:
                return p
        return _copy(u.src[0], device)
    return _concat([_copy(p, device) for p in u.src], u.arg)


def replicate(u: UOp) -> UOp:
    """MULTI `u` replicated on its devices (an all-gather when it is sharded)."""
    if u.arg is None:
        return u
    return multi([gather(u, d) for d in _devices(u)], None)


def reshard(u: UOp, axis: int | None) -> UOp:
    """MULTI `u` on the same devices, sharded along `axis` (None: replicated)."""
    if u.arg == axis:
        return u
    if axis is None:
        return replicate(u)
    n, size = len(u.src), shape_of(u)[axis]
    if size % n:
        raise InputError(f"can't shard axis {axis} of size {size} evenly over {n} devices")
    k = size // n
    if u.arg is None:  # each device already holds everything: keep its part, a view
        return multi([_shrink_axis(p, axis, i * k, (i + 1) * k) for i, p in enumerate(u.src)], axis)
    # device i needs rows [i*k, (i+1)*k) of `axis` from every part: a piece of each, copied in and concatenated
    devices = _devices(u)
    return multi(
        [
            _concat([_copy(_shrink_axis(p, axis, i * k, (i + 1) * k), d) for p in u.src], u.arg)
            for i, d in enumerate(devices)
        ],
        axis,
    )


# *** all-reduce ***


def all_reduce(op: Ops, parts: Sequence[UOp], ring: bool | None = None) -> list[UOp]:
    """`op` (ADD, MUL or MAX) over `parts` (one per device), the result on every device, in device order. `ring`
    picks the algorithm; None chooses by size and placement (`ring_chosen`)."""
    n = len(parts)
    if n == 1:
        return list(parts)
    if ring is None:
        ring = ring_chosen(parts)
    if not ring:
        return _direct_all_reduce(op, parts)
    in_place = _share_memory([device_of(p) for p in parts])  # type: ignore[misc]
    return _in_place_ring_all_reduce(op, parts) if in_place else _ring_all_reduce(op, parts)


def ring_chosen(parts: Sequence[UOp]) -> bool:
    """Whether `all_reduce(op, parts)` takes the ring: for more than RING_MIN_BYTES per device, between devices that
    copy bytes to each other. Devices that read each other's memory in place (CPU:0, CPU:1, ...) always take the
    direct one: realized together, its n replicas (the same sum of the same buffers) are one kernel that reads each
    input once and writes each replica once (2n units of memory traffic per element), the least an all-reduce with n
    outputs can do; the ring's chunk kernels and gathering kernel also write and read the reduced chunks (3n + 1
    units), in n + 1 launches."""
    if len(parts) == 1 or _share_memory([device_of(p) for p in parts]):  # type: ignore[misc]
        return False
    return math.prod(shape_of(parts[0])) * parts[0].dtype.itemsize > RING_MIN_BYTES.value


def _share_memory(devices: Sequence[str]) -> bool:
    """Whether kernels on each of `devices` can read the others' buffers in place (host memory, see placement.py)."""
    return all(shares_host_memory(devices[0], d) for d in devices[1:])


def _fold(op: Ops, values: Sequence[UOp]) -> UOp:
    out = values[0]
    for v in values[1:]:
        out = out.alu(op, v)
    return out


def _direct_all_reduce(op: Ops, parts: Sequence[UOp]) -> list[UOp]:
    # every device combines the parts in the same order (0, 1, ..., n-1), so every copy of the result is the same bits
    return [_fold(op, [_copy(p, device_of(d)) for p in parts]) for d in parts]  # type: ignore[arg-type]


def _chunks(parts: Sequence[UOp]) -> tuple[list[UOp], list[tuple[int, int]]]:
    """`parts` flattened, and the bounds of the (at most n) chunks a ring splits them into."""
    shape = shape_of(parts[0])
    total = math.prod(shape)
    flat = [UOp(Ops.RESHAPE, p.dtype, (p,), (total,)) if len(shape) != 1 else p for p in parts]
    step = -(-total // len(parts))
    return flat, [(c * step, min(total, (c + 1) * step)) for c in range(len(parts)) if c * step < total]


def _gathered(reduced: Sequence[UOp], devices: Sequence[str], shape: tuple[int, ...]) -> list[UOp]:
    """The all-gather that ends a ring: every device copies in the chunks `reduced` completed elsewhere."""
    out = []
    for d in devices:
        whole = _concat([_copy(r, d) for r in reduced], 0)
        out.append(UOp(Ops.RESHAPE, whole.dtype, (whole,), shape) if len(shape) != 1 else whole)
    return out


def _in_place_ring_all_reduce(op: Ops, parts: Sequence[UOp]) -> list[UOp]:
    # devices that read each other's memory need no ring of n-1 steps: chunk c is combined on device c straight from
    # every part (one kernel, each element added once, in device order), then every device gathers the chunks
    devices = [device_of(p) for p in parts]
    flat, bounds = _chunks(parts)
    reduced = [
        _fold(op, [_copy(_shrink_axis(f, 0, lo, hi), devices[c]) for f in flat])  # type: ignore[arg-type]
        for c, (lo, hi) in enumerate(bounds)
    ]
    return _gathered(reduced, devices, shape_of(parts[0]))  # type: ignore[arg-type]


def _ring_all_reduce(op: Ops, parts: Sequence[UOp]) -> list[UOp]:
    n = len(parts)
    devices = [device_of(p) for p in parts]
    flat, bounds = _chunks(parts)
    # reduce-scatter: chunk c travels the ring from device c+1, each device adding its piece, and ends complete on c
    reduced = []
    for c, (lo, hi) in enumerate(bounds):
        acc = _shrink_axis(flat[(c + 1) % n], 0, lo, hi)
        for k in range(2, n + 1):
            d = (c + k) % n
            acc = _copy(acc, devices[d]).alu(op, _shrink_axis(flat[d], 0, lo, hi))  # type: ignore[arg-type]
        reduced.append(acc)
    return _gathered(reduced, devices, shape_of(parts[0]))  # type: ignore[arg-type]


# *** pushing ops down to the parts ***


def _same_devices(srcs: Sequence[UOp], what: str) -> tuple[str, ...]:
    devices = {_devices(s) if s.op is Ops.MULTI else device_of(s) for s in srcs}
    if len(devices) != 1:
        raise MultiDeviceError(
            f"{what} of tensors on different devices: {sorted(map(str, devices))}; shard or move them onto one set "
            "of devices first (Tensor.shard(devices, axis) or .to(device))"
        )
    return next(iter(devices))  # type: ignore[return-value]


def _alu(root: UOp) -> UOp | None:
    if not any(s.op is Ops.MULTI for s in root.src):
        return None
    _same_devices(root.src, f"{root.op.name}")
    axis = next((s.arg for s in root.src if s.arg is not None), None)
    srcs = [reshard(s, axis) for s in root.src]
    return multi([root.replace(src=tuple(s.src[i] for s in srcs)) for i in range(len(srcs[0].src))], axis)


def _per_part(root: UOp, x: UOp) -> UOp:
    """CAST, BITCAST, CONTIGUOUS, DETACH: the same op on every part."""
    return multi([root.replace(src=(p,)) for p in x.src], x.arg)


def _reduce(root: UOp, x: UOp) -> UOp:
    op, axes = root.arg
    partial = [root.replace(src=(p,)) for p in x.src]
    if x.arg is None or x.arg not in axes:
        return multi(partial, x.arg)
    return multi(all_reduce(op, partial), None)


def _reshape_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int, n: int) -> int | None:
    """The axis of `new` that the parts of `old` (split along `axis` in n) are split along after a reshape, if they
    still are whole slices of one axis: the elements before it must number the same, and it must split in n."""
    before = math.prod(old[:axis])
    for b in range(len(new)):
        if math.prod(new[:b]) == before and new[b] % n == 0 and new[b] > 0:
            return b
    return None


def _movement(root: UOp, x: UOp) -> UOp:
    a, n, op = x.arg, len(x.src), root.op
    if a is None:
        return multi([root.replace(src=(p,)) for p in x.src], None)
    old, part = shape_of(x), shape_of(x.src[0])
    if op is Ops.RESHAPE:
        b = _reshape_axis(old, root.arg, a, n)
        if b is None:
            return _movement(root, replicate(x))
        arg = tuple(d // n if i == b else d for i, d in enumerate(root.arg))
        return multi([root.replace(src=(p,), arg=arg) for p in x.src], b)
    if op is Ops.EXPAND:
        arg = tuple(part[a] if i == a else d for i, d in enumerate(root.arg))
        return multi([root.replace(src=(p,), arg=arg) for p in x.src], a)
    if op is Ops.PERMUTE:
        return multi([root.replace(src=(p,)) for p in x.src], root.arg.index(a))
    if (op is Ops.PAD and root.arg[a] == (0, 0)) or (op is Ops.SHRINK and root.arg[a] == (0, old[a])):
        arg = tuple((0, part[a]) if op is Ops.SHRINK and i == a else p for i, p in enumerate(root.arg))
        return multi([root.replace(src=(p,), arg=arg) for p in x.src], a)
    if op is Ops.FLIP and root.arg[a]:
        # part i of the result is part n-1-i reversed
        flipped = [root.replace(src=(p,)) for p in x.src]
        return multi([_copy(flipped[n - 1 - i], d) for i, d in enumerate(_devices(x))], a)
    if op is Ops.FLIP:
        return multi([root.replace(src=(p,)) for p in x.src], a)
    # a pad or shrink that cuts the sharded axis: on the whole value, on every device
    return _movement(root, replicate(x))


def _copy_out(root: UOp, x: UOp) -> UOp:
    return gather(x, root.src[0].arg)


def _unsupported(root: UOp) -> UOp:
    raise NotImplementedError(
        f"{root.op.name} of a tensor on several devices is not supported; gather it first (.to())"
    )


_MULTI = UPat(Ops.MULTI, name="x")
multi_pm = PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="root"), _alu),
        (UPat((Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.DETACH), src=(_MULTI,), name="root"), _per_part),
        (UPat(Ops.REDUCE_AXIS, src=(_MULTI,), name="root"), _reduce),
        (UPat(GroupOp.Movement, src=(_MULTI,), name="root"), _movement),
        (UPat(Ops.COPY, src=(UPat(Ops.DEVICE), _MULTI), name="root"), _copy_out),
        (UPat(None, name="root"), _unsupported),
    ]
)


def lower_multi(u: UOp) -> UOp:
    """`u`, an op with a MULTI among its sources (whose own sources are already pushed down), as a MULTI of the
    same op on each device's part."""
    if any(isinstance(d, UOp) for s in u.src for d in (shape_of(s) or ())):
        raise NotImplementedError("tensors of symbolic shape on several devices are not supported")
    out = multi_pm.rewrite(u)
    assert out is not None
    return out


def needs_lowering(u: UOp) -> bool:
    """Whether `u` is an op over a MULTI that `lower_multi` must push down to the parts."""
    return u.op is not Ops.MULTI and any(s.op is Ops.MULTI for s in u.src)


# *** autograd ***


def _full_like(u: UOp, value: Any, dtype: DType | None = None) -> UOp:
    """A broadcast constant `value` (of `dtype`, by default `u`'s) with `u`'s shape on `u`'s device."""
    shape, dt = shape_of(u), dtype or u.dtype
    c = UOp(Ops.CONST, dt, (UOp(Ops.DEVICE, arg=device_of(u)),), dtypes.as_const(value, dt))
    c = UOp(Ops.RESHAPE, dt, (c,), (1,) * len(shape)) if shape else c
    return UOp(Ops.EXPAND, dt, (c,), shape) if shape and any(d != 1 for d in shape) else c


def _zeros_like(u: UOp) -> UOp:
    return _full_like(u, 0)


def compute_gradient_multi(
    root: UOp, root_grad: UOp, targets: set[UOp], origins: Mapping[UOp, UOp | None] | None = None
) -> dict[UOp, UOp]:
    """`compute_gradient` for graphs that hold tensors on several devices (plain graphs go straight to it).

    A replicated root is one value held n times: its gradient is seeded on device 0's copy only (seeding every copy
    would count it n times). A sharded target gets the MULTI of its parts' gradients; a replicated one, used by
    every device, the sum of its parts' gradients on every device: an all-reduce, which in data-parallel training is
    the averaging of the gradients.
    """
    if root.op is not Ops.MULTI and not any(t.op is Ops.MULTI for t in targets):
        return compute_gradient(root, root_grad, targets, origins)
    if root.op is Ops.MULTI:
        if root_grad.op is not Ops.MULTI:
            raise MultiDeviceError("the gradient of a tensor on several devices must be on the same devices")
        seed = reshard(root_grad, root.arg)
        roots = [(root.src[0], seed.src[0])] if root.arg is None else list(zip(root.src, seed.src))
    else:
        roots = [(root, root_grad)]
    flat = {p for t in targets for p in device_uops(t)}
    grads: dict[UOp, UOp] = {}
    for r, s in roots:
        for k, g in compute_gradient(r, s, flat, origins).items():
            grads[k] = grads[k] + g if k in grads else g
    out: dict[UOp, UOp] = {}
    for t in targets:
        if t.op is not Ops.MULTI:
            if t in grads:
                out[t] = grads[t]
            continue
        if not any(p in grads for p in t.src):
            continue
        parts = [grads[p] if p in grads else _zeros_like(p) for p in t.src]
        out[t] = multi(parts, t.arg) if t.arg is not None else multi(all_reduce(Ops.ADD, parts), None)
    return out


def map_parts(u: UOp, fn: Callable[[UOp], Any]) -> list[Any]:
    """`fn` applied to each device's part of `u` (to `u` itself when it is on one device)."""
    return [fn(p) for p in device_uops(u)]
