"""`Tensor`: a lazy n-dimensional array over a UOp graph. Operations build the graph; `realize()` schedules it into
fused kernels, compiles and runs them."""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import operator
import weakref
from collections.abc import Collection, Sequence
from contextlib import ContextDecorator
from typing import Any, ClassVar

import numpy as np

from lazygrad import engine, index_checks
from lazygrad.elementwise import ElementwiseMixin
from lazygrad.engine import device_of_name
from lazygrad.errors import InputError, KindError, RangeError
from lazygrad.functional import FunctionalMixin
from lazygrad.gradient import depends_on, graph_nodes, realized_graphs
from lazygrad.indexing import IndexingMixin
from lazygrad.movement import MovementMixin, _check_axis_type, always_le, show_sizes, symbolic_bounds
from lazygrad.multi import MultiDeviceError, compute_gradient_multi, device_uops, lower_multi, needs_lowering
from lazygrad.multi import gather as gather_multi
from lazygrad.multi import multi as multi_uop
from lazygrad.multi import reshard as reshard_multi
from lazygrad.multi import shard as shard_uop
from lazygrad.random import RandomMixin
from lazygrad.reduction import ReductionMixin
from lazygrad.split_reduce import split_reduce, vector_product
from lazygrad_scheduler import ScheduleItem
from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import (
    DType,
    DTypeError,
    dtypes,
    from_numpy_dtype,
    least_upper_dtype,
    least_upper_float,
    sum_dtype,
    to_dtype,
    to_numpy_dtype,
)
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.shape import device_of, resolve, shape_of
from lazygrad_uop.tensor_graph import (
    apply_movement,
    attach_buffer,
    base_buffer,
    buffer_of,
    is_leaf,
    is_view_of_leaf,
    leaf_view,
    new_buffer,
    view_base,
)
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

_all_tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()


def _apply_becomes(becomes: dict[UOp, UOp]) -> list[Tensor]:
    """Rewrite every live tensor's graph with `becomes`, so tensors that share a subgraph share its result; returns
    the tensors it changed."""
    if not becomes:
        return []
    changed = _holding(list(_all_tensors), becomes.keys())
    if changed:
        # one substitution over all of them: their graphs share most nodes, which are then walked once
        new = UOp(Ops.SINK, dtypes.void, tuple(t.uop for t in changed)).substitute(becomes)
        for t, u in zip(changed, new.src, strict=True):
            t.uop = u
    return changed


def _holding(tensors: list[Tensor], keys: Collection[UOp], remember: bool = True) -> list[Tensor]:
    """The tensors of `tensors` whose graph holds a node of `keys`. `remember`: note the graphs without one as looked
    at (a realize does, whose rewrite leaves exactly those unchanged; a look before a graph changes does not).

    A graph this looked at before, unchanged since, is asked through its toposort (built once, then cached on its
    root): a dict lookup per key, so that many realizes of a few small tensors (the random generator's state while a
    model's parameters wait) cost little per waiting tensor. The other graphs, new since the last look (a step's
    activations, and what a realize just rewrote), are walked together, each node once: they share most of their
    nodes (each activation's graph is inside the next one's), where a toposort per tensor would cost about the square
    of the graph's size."""
    holds: dict[UOp, bool] = {}  # node -> whether a key is in its graph
    for t in tensors:
        root = t.uop
        if root in holds:
            continue
        if root.toposort_built or (remember and root in _looked_at):
            topo = root.toposort
            holds[root] = any(k in topo for k in keys) if len(keys) < len(topo) else not keys.isdisjoint(topo)
            continue
        stack = [root]
        while stack:
            n = stack[-1]
            if n in holds:
                stack.pop()
            elif n in keys or not n.src:
                holds[n] = n in keys
                stack.pop()
            elif todo := [s for s in n.src if s not in holds]:
                stack.extend(todo)
            else:
                holds[n] = any(holds[s] for s in n.src)
                stack.pop()
    if remember:
        _looked_at.clear()
        _looked_at.update(t.uop for t in tensors if not holds[t.uop])
    return [t for t in tensors if holds[t.uop]]


# the graphs `_holding` looked at last and left unchanged (weakly: a graph no tensor holds any more goes)
_looked_at: weakref.WeakSet[UOp] = weakref.WeakSet()


def _requires_grad_uops() -> set[UOp]:
    # a tensor on several devices is a leaf through each of its parts
    return {u for t in list(_all_tensors) if t.requires_grad for u in (t.uop, *device_uops(t.uop))}


def _normalize_axis(axis: int, ndim: int) -> int:
    _check_axis_type(axis)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise RangeError(f"axis {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % max(ndim, 1)


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise InputError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} can't be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


class Tensor(ElementwiseMixin, MovementMixin, IndexingMixin, ReductionMixin, FunctionalMixin, RandomMixin):
    """A lazy tensor. Build with `Tensor([[1, 2], [3, 4]])`, `Tensor(np_array)`, `Tensor.zeros(3, 4)`, ...;
    read with `.numpy()`, `.item()`, `.tolist()`.

    The core (construction, realization, the primitive movement, elementwise and reduce ops) is here; the rest of
    the API comes from the mixins, one module per kind of op: `elementwise`, `movement`, `indexing`, `reduction`,
    `functional` (conv, pool, norms, losses) and `random`."""

    __slots__ = ("__weakref__", "_requires_grad", "grad", "uop")

    training: ClassVar[bool] = False
    """True inside `Tensor.train()`: layers such as BatchNorm and dropout use their training behaviour."""
    no_grad: ClassVar[bool] = False
    """While True (see `lazygrad.no_grad()`), results of operations are cut from autograd as by `.detach()`."""

    class train(ContextDecorator):  # noqa: N801 - tinygrad's and torch's name
        """`with Tensor.train():` (or as a decorator) sets `Tensor.training` to `mode` and restores it after."""

        def __init__(self, mode: bool = True) -> None:
            self.mode = mode

        def __enter__(self) -> None:
            self.prev, Tensor.training = Tensor.training, self.mode

        def __exit__(self, *exc: object) -> None:
            Tensor.training = self.prev

    def __init__(
        self,
        data: Any,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> None:
        dtype = to_dtype(dtype) if dtype is not None else None
        if isinstance(device, (tuple, list)) and not isinstance(data, UOp):
            # on several devices: the same value on each of them (replicated)
            devices = tuple(Device.canonicalize(d) for d in device)
            parts = [Tensor(data, device=d, dtype=dtype).uop for d in devices]
            data, device = UOp(Ops.MULTI, parts[0].dtype, tuple(parts), None), None
        dev = device_of_name(device) if not isinstance(data, UOp) else ""
        if isinstance(data, UOp):
            uop = data
        elif isinstance(data, Tensor):
            uop = data.uop if dtype is None else data.cast(dtype).uop
        elif isinstance(data, np.generic):  # before Python scalars: np.float64 is a float subclass
            dt = dtype or from_numpy_dtype(data.dtype)
            uop = UOp(Ops.CONST, dt, (UOp(Ops.DEVICE, arg=dev),), dtypes.as_const(data.item(), dt))
        elif isinstance(data, (bool, int, float)):
            dt = dtype or _int_holding(dtypes.from_py(data), data, data)
            uop = UOp(Ops.CONST, dt, (UOp(Ops.DEVICE, arg=dev),), dtypes.as_const(data, dt))
        elif isinstance(data, (list, tuple)):
            dt = dtype or dtypes.from_py(data)
            if dtype is None and dt == dtypes.default_int:
                arr = np.array(data)  # int64, uint64 or object as the values need
                dt = _int_holding(dt, arr.min(initial=0), arr.max(initial=0))
            uop = _from_numpy(np.array(data, dtype=_np_storage(dt)), dev, dt)
        elif isinstance(data, np.ndarray):
            dt = dtype or from_numpy_dtype(data.dtype)
            uop = _from_numpy(data.astype(_np_storage(dt), copy=False), dev, dt)
        else:
            raise KindError(f"can't make a Tensor from {type(data).__name__}; use a number, nested list or numpy array")
        if Tensor.no_grad and isinstance(data, UOp) and uop.op is not Ops.DETACH and not is_view_of_leaf(uop):
            uop = UOp(Ops.DETACH, uop.dtype, (uop,))
        if needs_lowering(uop):
            uop = lower_multi(uop)
        self.uop: UOp = uop
        self._requires_grad: bool | None = None
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        shape_of(uop)  # shape errors surface where the tensor is built, not at realize time
        _all_tensors.add(self)

    # *** properties ***

    @property
    def requires_grad(self) -> bool | None:
        """True: `backward()` fills `.grad`; None: undecided (an optimizer turns it on); False: never."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value and not self._requires_grad and not _stored(self.uop):
            # a leaf of autograd must be a node of its own: equal lazy graphs are one node, so two parameters made
            # alike (two Tensor.zeros(4) biases), or a parameter and an equal constant elsewhere in the loss, would
            # be one target and collect each other's gradients
            self.uop = _own_node(self.uop)
        self._requires_grad = value

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each dimension."""
        return shape_of(self.uop)

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self.uop.dtype

    @property
    def device(self) -> str | tuple[str, ...]:
        """The device the tensor lives on; for a tensor on several devices (see `shard`), the tuple of them."""
        dev = device_of(self.uop)
        assert dev is not None
        return dev

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        """The shape, or the size of dimension `dim`."""
        return self.shape if dim is None else self.shape[_normalize_axis(dim, self.ndim)]

    def element_size(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of all elements."""
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        """True for floating-point dtypes."""
        return dtypes.is_float(self.dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise KindError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<Tensor {self.shape} {self.dtype!r} on {self.device}>"

    # *** creation ***

    @staticmethod
    def full(
        shape: Sequence[int] | int, fill_value: Any, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        """A tensor of `shape` filled with `fill_value` (no memory until realized: a broadcast constant)."""
        shape = _creation_shape(shape, "full")
        c = Tensor(fill_value, device=device, dtype=dtype)
        return c.reshape((1,) * len(shape)).expand(shape) if shape else c

    @staticmethod
    def zeros(*shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """A tensor of zeros."""
        return Tensor.full(_creation_shape(shape, "zeros"), 0.0, dtype=dtype or dtypes.default_float, device=device)

    @staticmethod
    def ones(*shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """A tensor of ones."""
        return Tensor.full(_creation_shape(shape, "ones"), 1.0, dtype=dtype or dtypes.default_float, device=device)

    @staticmethod
    def empty(*shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """A tensor with memory but no defined contents."""
        shape = _creation_shape(shape, "empty")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if isinstance(device, (tuple, list)):
            parts = tuple(Tensor.empty(*shape, dtype=dt, device=d).uop for d in device)
            return Tensor(UOp(Ops.MULTI, dt, parts, None))
        buf = new_buffer(device_of_name(device), math.prod(shape), dt)
        return Tensor(UOp(Ops.VIEW, dt, (buf,), ShapeTracker.from_shape(shape)))

    @staticmethod
    def arange(
        start: int | float,
        stop: int | float | None = None,
        step: int | float = 1,
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """Evenly spaced values in [start, stop), as torch.arange."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise InputError("arange step must not be zero")
        if isinstance(start, UOp) or isinstance(stop, UOp):
            return Tensor._symbolic_arange(start, stop, step, dtype, device)
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        if dtypes.is_bool(dt):
            raise KindError("arange can't make bool values (as torch); make an integer range and compare it")
        n = max(0, math.ceil((stop - start) / step))
        if dtype is None and n:
            # torch's int64 holds every value; ours is int32 while the values fit it
            dt = _int_holding(dt, min(start, start + (n - 1) * step), max(start, start + (n - 1) * step))
        # start + i*step computed on the host as torch does, then uploaded: small and exact
        vals = start + np.arange(n, dtype=np.float64 if dtypes.is_float(dt) else np.int64) * step
        return Tensor(vals.astype(_np_storage(dt)), device=device, dtype=dt)

    @staticmethod
    def _symbolic_arange(start: Any, stop: Any, step: Any, dtype: DType | str | None, device: str | None) -> Tensor:
        """arange with a symbolic bound: the first `count` values of an arange as long as `count` can get, so one
        buffer and one kernel serve every value of the variables."""
        if not (isinstance(start, int) and isinstance(stop, UOp) and isinstance(step, int) and step > 0):
            # a symbolic value (not a size) has no tensor-graph node: a symbolic start would have to be one
            raise NotImplementedError(
                f"arange({show_sizes(start)}, {show_sizes(stop)}, {show_sizes(step)}): with a symbolic bound, only "
                "the stop may be symbolic, with an int start and a positive int step"
            )
        count = ((stop - start + step - 1) // step).ssimplify()
        if not always_le(0, count):
            raise InputError(
                f"arange({show_sizes(start)}, {show_sizes(stop)}, {step}) is empty or negative for some values in "
                f"its variables' bounds ({symbolic_bounds(start, stop)}); keep stop >= start for all of them"
            )
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        longest = Tensor.arange(int(count.vmax), dtype=dt, device=device)
        first = longest.shrink(((0, count),))
        return first if step == 1 and start == 0 else first * step + start

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """The identity matrix (n x m)."""
        m = n if m is None else m
        if n < 0 or m < 0:
            raise InputError(f"eye needs non-negative sizes, got {n} x {m}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        k = min(n, m)
        if k == 0:
            return Tensor.zeros(n, m, dtype=dt, device=device)
        diag = Tensor.full((k, 1), 1, dtype=dt, device=device).pad(((0, 0), (0, k))).flatten()
        sq = diag.shrink(((0, k * k),)).reshape(k, k)
        return sq.pad(((0, n - k), (0, m - k)))

    @staticmethod
    def linspace(
        start: int | float, stop: int | float, steps: int, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        """`steps` evenly spaced values from start to stop inclusive, as torch.linspace."""
        if steps < 0:
            raise InputError(f"linspace needs a non-negative number of steps, got {steps}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dtypes.is_bool(dt):
            raise KindError("linspace can't make bool values (as torch); make a float range and compare it")
        if steps == 1:
            return Tensor.full((1,), start, dtype=dt, device=device)
        step = (stop - start) / (steps - 1) if steps > 1 else 0.0
        # torch fills the second half backwards from stop, so both ends are exact
        i = np.arange(steps, dtype=np.float64)
        vals = np.where(i < steps // 2, start + step * i, stop - step * (steps - 1 - i))
        return Tensor(vals.astype(_np_storage(dt)), device=device, dtype=dt)

    def full_like(self, fill_value: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """A tensor of this shape (and dtype and device, unless given) filled with `fill_value`."""
        return Tensor.full(self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.device)

    def zeros_like(self, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Zeros of this shape."""
        return self.full_like(0, dtype, device)

    def ones_like(self, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Ones of this shape."""
        return self.full_like(1, dtype, device)

    # *** realization ***

    def kernelize(self, *others: Tensor) -> Tensor:
        """Cut the graphs of this tensor and `others` into kernels: each becomes ASSIGN(buffer, KERNEL)."""
        engine.kernelize_tensors((self, *others))
        return self

    def schedule(self, *others: Tensor) -> list[ScheduleItem]:
        """The kernels that realize this tensor and `others`, in order (kernelizes them; runs nothing)."""
        return engine.schedule_tensors((self, *others))

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`, in the same schedule so they can share kernels)."""
        # index checks not yet computed go along (they share the indices); they are read at the next read
        engine.realize([self, *others, *index_checks.uncomputed()])
        return self

    def assign(self, x: Any) -> Tensor:
        """Overwrite this tensor's values with `x` in place (kernels that read the old values run first)."""
        x = x if isinstance(x, Tensor) else Tensor(x, device=self.device, dtype=self.dtype)
        if self.uop.op is Ops.MULTI or x.uop.op is Ops.MULTI:
            return self._assign_multi(x)
        if x.shape != self.shape:
            x = x._broadcast_to(_broadcast_shape(x.shape, self.shape))
        if x.shape != self.shape:
            raise InputError(f"assign of shape {x.shape} to a tensor of shape {self.shape}")
        if x.device != self.device:
            raise InputError(f"assign from {x.device} to a tensor on {self.device}; move it with .to() first")
        if x.dtype != self.dtype:
            raise DTypeError(f"assign of {x.dtype!r} to a {self.dtype!r} tensor; cast it first")
        base = view_base(self.uop)
        if not is_leaf(base):
            # a view of tensors not stored yet (`g[0:1].assign(x)` with g lazy): store the tensors it views, so that
            # the write lands in their memory; with no such tensor alive, nothing can see the old values and this
            # tensor simply becomes x
            viewed = set()
            u = self.uop
            while u is not base:
                u = u.src[0]
                viewed.add(u)
            owners = [t for t in list(_all_tensors) if t.uop in viewed and t is not self]
            if not owners:
                self.uop = x.uop
                return self
            Tensor.realize(*owners)
            base = view_base(self.uop)
        target = self.uop
        self.uop = UOp(Ops.ASSIGN, self.dtype, (target, x.uop))
        if target is not base and not (target.op is Ops.VIEW and target.src[0] is base):
            # a view into another tensor's memory: write now, as torch's in-place ops on views do, so that the tensor
            # it views sees the new values (left lazy, only this view's tensor would ever run the write)
            self.realize()
        return self

    def _assign_multi(self, x: Tensor) -> Tensor:
        """assign for tensors on several devices: each part is assigned its part of `x` (re-sharded like this one)."""
        if self.device != x.device:
            raise MultiDeviceError(
                f"assign from {x.device} to a tensor on {self.device}; shard or move it onto the same devices first"
            )
        if x.shape != self.shape:
            x = x._broadcast_to(_broadcast_shape(x.shape, self.shape))
        if x.shape != self.shape:
            raise InputError(f"assign of shape {x.shape} to a tensor of shape {self.shape}")
        value = reshard_multi(x.uop, self.uop.arg)
        parts = [Tensor(t).assign(Tensor(v)).uop for t, v in zip(self.uop.src, value.src, strict=True)]
        self.uop = UOp(Ops.MULTI, self.dtype, tuple(parts), self.uop.arg)
        return self

    # *** several devices ***

    def shard(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
        """This tensor on `devices`: split into equal parts along `axis`, one per device in order, or the whole of
        it on each (axis=None, replicated). Operations on it run on every device, each on its part; reading it
        (`.numpy()`, `.to(device)`) gathers the parts. A tensor already on several devices is re-sharded."""
        if not isinstance(devices, (tuple, list)) or not devices:
            raise KindError(f"shard needs a tuple of device names, e.g. ('CPU:0', 'CPU:1'), got {devices!r}")
        devs = tuple(Device.canonicalize(d) for d in devices)
        if len(set(devs)) != len(devs):
            raise InputError(f"shard over the devices {devs} names a device twice")
        ax = None if axis is None else _normalize_axis(axis, self.ndim)
        if self.uop.op is Ops.MULTI:
            if self.device == devs:
                return Tensor(reshard_multi(self.uop, ax))
            return self.to(devs[0]).shard(devs, ax)
        return Tensor(shard_uop(self.uop, devs, ax))

    @staticmethod
    def from_shards(parts: Sequence[Tensor], axis: int | None = None) -> Tensor:
        """The tensor on several devices whose parts are `parts` (one tensor per device, all of one shape and dtype),
        concatenated along `axis`, or each the whole value (None). Data already split on the host goes straight to
        its device this way, with no copy between devices."""
        if not parts or any(isinstance(p.device, tuple) for p in parts):
            raise KindError("from_shards takes a non-empty sequence of tensors, each on one device")
        ax = None if axis is None else _normalize_axis(axis, parts[0].ndim)
        if len({(p.shape, p.dtype) for p in parts}) != 1:
            raise InputError(f"the parts must have one shape and dtype, got {[(p.shape, p.dtype) for p in parts]}")
        return Tensor(multi_uop([p.uop for p in parts], ax))

    def shard_(self, devices: Sequence[str], axis: int | None = None) -> Tensor:
        """`shard` in place: this tensor now lives on `devices` (e.g. a model's parameters, before an optimizer is
        made for them)."""
        self.uop = self.shard(devices, axis).uop
        return self

    @property
    def shard_axis(self) -> int | None:
        """The axis a tensor on several devices is split along; None when it is replicated or on one device."""
        return self.uop.arg if self.uop.op is Ops.MULTI else None

    def contiguous(self) -> Tensor:
        """This tensor stored densely in its own buffer when realized."""
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def clone(self) -> Tensor:
        """A copy in its own buffer (later in-place updates of either don't show in the other)."""
        return self.contiguous()

    def detach(self) -> Tensor:
        """The same values, cut from the autograd graph."""
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    # *** autograd ***

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set `requires_grad` in place (None: undecided, an optimizer turns it on; False: never) and return self."""
        self.requires_grad = requires_grad
        return self

    def gradient(
        self, *targets: Tensor, gradient: Tensor | None = None, materialize_grads: bool = False
    ) -> list[Tensor]:
        """The gradients of this tensor with respect to each of `targets`, as lazy tensors (nothing runs yet).

        `gradient` seeds the backward pass (default: 1 for a one-element tensor). A target this tensor reaches only
        through non-differentiable ops (comparisons, `sign`, the sign taken by `copysign`, `x ** 0`) gets zeros, as in
        torch and tinygrad; one outside its graph (or reached only through `detach`) raises, or gets zeros with
        materialize_grads.
        """
        seed = self._gradient_seed(gradient)
        grads = compute_gradient_multi(self.uop, seed.uop, {t.uop for t in targets}, realized_graphs.mapping)
        out = []
        for t in targets:
            if (g := grads.get(t.uop)) is not None:
                out.append(Tensor(g))
            elif materialize_grads or depends_on(self.uop, t.uop, realized_graphs.mapping):
                out.append(t.zeros_like())
            else:
                raise RuntimeError(
                    f"this tensor does not depend on the target of shape {t.shape} (or only through detach or a "
                    "realized tensor: realizing keeps the graph for autograd only where "
                    "it reaches a tensor with requires_grad=True, so set that on the target before computing); pass "
                    "materialize_grads=True to get zeros for it"
                )
        return out

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate the gradient of this tensor into `.grad` of every tensor with requires_grad=True it depends on.
        If it depends on none, as in tinygrad code that leaves requires_grad at its default None, the floating-point
        tensors of data (and views of them) with requires_grad None that it depends on get theirs instead; tensors
        with requires_grad=False never do.

        Reading values first (`.numpy()`, `.item()`, `.realize()` of the loss or of any intermediate) doesn't change
        the gradients: autograd goes through realized tensors to the graphs they were computed from. The gradients
        stay lazy, so `Tensor.realize(*grads)` or an optimizer step computes them in one schedule with everything
        else; as in torch (without create_graph), they are cut from autograd themselves.
        """
        graph = graph_nodes(self.uop, realized_graphs.mapping)
        live = [t for t in list(_all_tensors) if any(u in graph for u in device_uops(t.uop))]
        leaves = [t for t in live if t.requires_grad]
        if not leaves:
            # data: float tensors of buffers that hold no computed result (autograd goes through those to their graph)
            leaves = [
                t
                for t in live
                if t.requires_grad is None
                and dtypes.is_float(t.dtype)
                and is_view_of_leaf(t.uop)
                and t.uop not in realized_graphs.mapping
            ]
        grads = compute_gradient_multi(
            self.uop, self._gradient_seed(gradient).uop, {t.uop for t in leaves}, realized_graphs.mapping
        )
        if not grads:
            raise RuntimeError(
                "backward() reached no tensor with requires_grad=True, nor data left at requires_grad=None: set it on "
                "the inputs to differentiate (an optimizer sets it on its parameters) before computing the loss"
            )
        for t in leaves:
            if (g := grads.get(t.uop)) is not None:
                g = Tensor(_detached(g))
                t.grad = g if t.grad is None else t.grad.assign(t.grad + g)
        return self

    def _gradient_seed(self, gradient: Tensor | None) -> Tensor:
        if not dtypes.is_float(self.dtype):
            raise DTypeError(f"only floating-point tensors have gradients, this one is {self.dtype!r}")
        if gradient is None:
            if self.numel() != 1:
                raise InputError(
                    f"backward() without a gradient needs a one-element tensor, this one has shape {self.shape}; "
                    "reduce it (e.g. .sum()) or pass gradient= of the same shape"
                )
            return self.full_like(1.0)
        if gradient.shape != self.shape:
            raise InputError(f"gradient of shape {gradient.shape} for a tensor of shape {self.shape}")
        return gradient.cast(self.dtype)

    def to(self, device: str | Sequence[str]) -> Tensor:
        """This tensor on `device` (copied when realized); a tensor on several devices is gathered there. A tuple
        of devices replicates it on them (`shard(devices)`)."""
        if isinstance(device, (tuple, list)):
            return self.shard(device)
        dev = Device.select(device)
        if self.uop.op is Ops.MULTI:
            return Tensor(gather_multi(self.uop, dev))
        if dev == self.device:
            return self
        return Tensor(UOp(Ops.COPY, self.dtype, (UOp(Ops.DEVICE, arg=dev), self.uop)))

    def _buffer_view(self) -> tuple[Buffer, ShapeTracker]:
        """Realize, then the buffer holding this tensor and how the tensor is laid out in it."""
        self.realize()
        base = view_base(self.uop)
        chain = []
        u = self.uop
        while u is not base:
            chain.append(u)
            u = u.src[0]
        st = apply_movement(leaf_view(base), chain[::-1])
        buf = buffer_of(base_buffer(base))
        if not buf.is_allocated:
            buf.allocate()  # an `empty` tensor gets memory when first read
        return buf, st

    def numpy(self) -> np.ndarray:
        """The values as a numpy array: a read-only view of the device memory when that is possible, else a copy."""
        if self.uop.op is Ops.MULTI:
            return self.to(self.device[0]).numpy()
        index_checks.verify(self)  # a read synchronises: indices found out of range on the device raise here
        npdt = to_numpy_dtype(self.dtype)
        if not all(isinstance(d, int) for d in self.shape):
            # a symbolic shape is read at the values its variables are bound to
            shape = tuple(map(resolve, self.shape))
            buf, st = (self if is_view_of_leaf(self.uop) else self.contiguous())._buffer_view()
            st = st.substitute({b: b.src[1] for b in st.binds()})
            if not st.contiguous:
                return self.reshape(shape).numpy()
            host = np.empty(buf.size, dtype=npdt)
            buf.copyout(memoryview(host).cast("B"))
            return host[: math.prod(shape)].reshape(shape)
        if self.numel() == 0:
            return np.zeros(self.shape, dtype=npdt)
        src = self if is_view_of_leaf(self.uop) else self.contiguous()
        buf, st = src._buffer_view()
        if not (st.contiguous and st.size == buf.size):
            buf, st = self.contiguous()._buffer_view()
        as_buffer = getattr(buf.allocator, "_as_buffer", None)
        if as_buffer is not None:
            return np.asarray(_HostView(as_buffer(buf.handle), buf, npdt)).reshape(self.shape)
        host = np.empty(buf.size, dtype=npdt)
        buf.copyout(memoryview(host).cast("B"))
        return host.reshape(self.shape)

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self.numel() != 1:
            raise InputError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        """The values as (nested) Python lists."""
        return self.numpy().tolist()

    # *** movement ***

    def _mop(self, op: Ops, arg: Any) -> Tensor:
        return Tensor(UOp(op, self.dtype, (self.uop,), arg))

    def reshape(self, *shape: Any) -> Tensor:
        """The same elements in a new shape; one dimension may be -1 (inferred), and None keeps the size of the
        dimension at its position (tinygrad's `reshape(None, -1)`)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(self.shape[i] if d is None and i < self.ndim else d for i, d in enumerate(shape))
        if any(d is None for d in shape):
            raise InputError(f"reshape to {shape}: None keeps a dimension, and {self.shape} has no such one")
        new = list(_shape_arg(shape))
        if any(isinstance(d, UOp) for d in (*new, *self.shape)):
            # symbolic sizes are checked at the values their variables are bound to
            if -1 in new or math.prod(map(resolve, new)) != math.prod(map(resolve, self.shape)):
                raise InputError(
                    f"can't reshape {show_sizes(self.shape)} to {show_sizes(tuple(new))} (with symbolic sizes: equal "
                    "element counts at the bound values, and no -1)"
                )
            return self if tuple(new) == self.shape else self._mop(Ops.RESHAPE, tuple(new))
        if new.count(-1) > 1:
            raise InputError(f"only one dimension can be -1 in reshape, got {tuple(new)}")
        if -1 in new:
            rest = math.prod(d for d in new if d != -1)
            if rest == 0 or self.numel() % rest:
                raise InputError(f"can't reshape {self.shape} to {tuple(new)}")
            new[new.index(-1)] = self.numel() // rest
        if any(d < 0 for d in new):
            raise InputError(f"reshape sizes must be non-negative, got {tuple(new)}")
        if math.prod(new) != self.numel():
            raise InputError(f"can't reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
        return self if tuple(new) == self.shape else self._mop(Ops.RESHAPE, tuple(new))

    def view(self, *shape: Any) -> Tensor:
        """Alias of reshape."""
        return self.reshape(*shape)

    def expand(self, *shape: Any) -> Tensor:
        """Broadcast size-1 dimensions to `shape` (-1 keeps a dimension); new leading dimensions are added."""
        new = _shape_arg(shape)
        if len(new) < self.ndim:
            raise InputError(f"can't expand {self.shape} to fewer dimensions {new}")
        base = self.reshape((1,) * (len(new) - self.ndim) + self.shape) if len(new) != self.ndim else self
        target = tuple(b if n == -1 else n for n, b in zip(new, base.shape))
        for b, n in zip(base.shape, target):
            if b != n and b != 1:
                raise InputError(f"can't expand {self.shape} to {new}: only size-1 dimensions can grow")
        return base if target == base.shape else base._mop(Ops.EXPAND, target)

    def permute(self, *order: Any) -> Tensor:
        """Reorder the dimensions."""
        order = tuple(_normalize_axis(a, self.ndim) for a in _shape_arg(order))
        if sorted(order) != list(range(self.ndim)):
            raise InputError(f"{order} is not a permutation of the {self.ndim} dimensions of {self.shape}")
        return self if order == tuple(range(self.ndim)) else self._mop(Ops.PERMUTE, order)

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        """Swap two dimensions."""
        order = list(range(self.ndim))
        a, b = _normalize_axis(dim0, self.ndim), _normalize_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        """The tensor with its dimensions reversed."""
        return self.permute(tuple(range(self.ndim))[::-1])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dimensions start_dim..end_dim into one."""
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _normalize_axis(start_dim, self.ndim), _normalize_axis(end_dim, self.ndim)
        return self.reshape(self.shape[:s] + (math.prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def squeeze(self, dim: int | None = None) -> Tensor:
        """Drop size-1 dimensions (or just `dim` if it has size 1)."""
        if dim is None:
            return self.reshape(tuple(d for d in self.shape if d != 1))
        d = _normalize_axis(dim, self.ndim)
        return self if self.ndim == 0 or self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        """Insert a size-1 dimension at `dim`."""
        d = _normalize_axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> Tensor:
        """Pad: one (before, after) pair per dimension, or a flat torch-style tuple from the last dim. mode
        "constant" fills with `value`; "reflect", "replicate" and "circular" repeat the tensor's own elements."""
        if not isinstance(mode, str):
            raise KindError(f"pad mode must be a string (the fill value is value=...), got {mode!r}")
        pairs = _pad_pairs(padding, self.ndim)
        if any(isinstance(p, UOp) and not always_le(0, p) for pair in pairs for p in pair):
            raise InputError(
                f"pad {show_sizes(pairs)} has a symbolic amount that can be negative ({symbolic_bounds(*pairs)}); "
                "symbolic padding must be >= 0 for every value of its variables"
            )
        if mode != "constant":
            padded = [d for (b, a), d in zip(pairs, self.shape) if not (isinstance(b, int) and b == a == 0)]
            if any(isinstance(x, UOp) for x in (*padded, *(p for pair in pairs for p in pair))):
                raise NotImplementedError(
                    f"pad mode {mode!r} of shape {show_sizes(self.shape)} by {show_sizes(pairs)}: a symbolic size or "
                    "amount is supported by mode 'constant' only"
                )
            return self._pad_mode(pairs, mode)
        if any(not isinstance(p, UOp) and p < 0 for pair in pairs for p in pair):
            # negative padding crops, as in torch (symbolic amounts are never negative, checked above)
            def cut(p: Any) -> Any:
                return 0 if isinstance(p, UOp) else max(0, -p)

            def grow(p: Any) -> Any:
                return p if isinstance(p, UOp) else max(0, p)

            crop = tuple((cut(b), d - cut(a)) for (b, a), d in zip(pairs, self.shape))
            return self.shrink(crop).pad(tuple((grow(b), grow(a)) for b, a in pairs), value=value)
        if all(isinstance(b, int) and isinstance(a, int) and b == a == 0 for b, a in pairs):
            return self
        out = self._padded(pairs)
        if value == 0 and math.copysign(1.0, value) > 0 and not _nonzero_at_zero(self.uop):
            return out
        # the padding of a fused kernel evaluates the padded expression with its inputs read as 0: right for most
        # ops, but exp(0), 1/0, log(0) aren't 0, so such values (and other fill values) are selected explicitly; the
        # fill takes the tensor's dtype, as in torch
        return self._padding_mask(pairs).where(out, self._const_like(value))

    def _padded(self, pairs: tuple[tuple[Any, Any], ...]) -> Tensor:
        return self._mop(Ops.PAD, pairs)._canonical()

    def _padding_mask(self, pairs: tuple[tuple[Any, Any], ...]) -> Tensor:
        """The shape of `self._padded(pairs)`: True where it holds this tensor's elements, False in the padding."""
        return Tensor.full(self.shape, True, dtype=dtypes.bool, device=self.device)._padded(pairs)

    def _canonical(self) -> Tensor:
        """This tensor with each symbolic size in the symbolic engine's form ((n + 2) + 1 as n + 3, (a + n) - a as
        n, n + (40 - n) as 40): equal sizes built different ways must be one expression to meet in elementwise ops."""
        canonical = tuple(d.ssimplify() if isinstance(d, UOp) else d for d in self.shape)
        return self if canonical == self.shape else self.reshape(canonical)

    def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
        """Keep [start, end) of each dimension (None keeps all of it)."""
        if len(arg) != self.ndim:
            raise InputError(f"shrink needs one (start, end) per dimension of {self.shape}, got {arg}")
        pairs = tuple((0, d) if a is None else (_sint(a[0]), _sint(a[1])) for a, d in zip(arg, self.shape))
        for (b, e), d in zip(pairs, self.shape):
            if not 0 <= resolve(b) <= resolve(e) <= resolve(d):
                raise InputError(f"shrink {pairs} is out of range for shape {self.shape}")
            if not (always_le(0, b) and always_le(b, e) and always_le(e, d)):
                raise InputError(
                    f"shrink {show_sizes(pairs)} fits shape {show_sizes(self.shape)} at the bound values but not "
                    f"for every value in the variables' bounds ({symbolic_bounds(b, e, d)}), and its kernel runs for "
                    "all of them: narrow the bounds so that 0 <= start <= end <= size always holds"
                )
        if all(p == (0, d) for p, d in zip(pairs, self.shape)):
            return self
        return self._mop(Ops.SHRINK, pairs)._canonical()

    def flip(self, *axis: Any) -> Tensor:
        """Reverse the order of elements along `axis`."""
        axes = _unique_axes(_shape_arg(axis), self.ndim, "flip")
        return self._mop(Ops.FLIP, tuple(i in axes for i in range(self.ndim))) if axes else self

    def _slice_dim(self, dim: int, start: int, stop: int, step: int) -> Tensor:
        size = self.shape[dim]
        if step < 0:
            # reverse, then take the mirrored range with a positive step
            flipped = self.flip(dim)
            return flipped._slice_dim(dim, size - 1 - start, size - 1 - stop, -step)
        n = max(0, math.ceil((stop - start) / step))
        box = [(0, d) for d in self.shape]
        end = min(start + n * step, size) if n else start
        box[dim] = (start, end)
        t = self.shrink(box)
        if step == 1 or n == 0:
            return t
        # every step-th element: pad to n*step, view as (n, step), keep column 0
        pad = [(0, 0)] * self.ndim
        pad[dim] = (0, n * step - (end - start))
        t = t.pad(pad)
        shape = t.shape
        t = t.reshape(shape[:dim] + (n, step) + shape[dim + 1 :])
        keep = [(0, d) for d in t.shape]
        keep[dim + 1] = (0, 1)
        return t.shrink(keep).reshape(shape[:dim] + (n,) + shape[dim + 1 :])

    # *** elementwise ***

    def _const_like(self, x: Any, dtype: DType | None = None) -> Tensor:
        return Tensor(x, device=self.device, dtype=dtype or self.dtype)

    def _broadcasted(self, y: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x: Tensor = self
        if not isinstance(y, Tensor):
            if isinstance(y, np.ndarray):
                y = Tensor(y, device=x.device)
            else:
                # Python scalars take the tensor's dtype within its category, as in torch
                if isinstance(y, float) and not dtypes.is_float(x.dtype):
                    dt = dtypes.default_float
                elif isinstance(y, int) and not isinstance(y, bool) and dtypes.is_bool(x.dtype):
                    dt = dtypes.default_int
                else:
                    dt = x.dtype
                y = Tensor(y, device=x.device, dtype=dt)
        if x.device != y.device:
            raise InputError(f"tensors are on different devices, {x.device} and {y.device}; move one with .to()")
        out_dt = least_upper_dtype(x.dtype, y.dtype)
        x, y = x.cast(out_dt), y.cast(out_dt)
        if reverse:
            x, y = y, x
        shape = _broadcast_shape(x.shape, y.shape)
        return x._broadcast_to(shape), y._broadcast_to(shape)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)

    def _alu(self, op: Ops, *srcs: Tensor) -> Tensor:
        return Tensor(self.uop.alu(op, *(s.uop for s in srcs)))

    def cast(self, dtype: DType | str) -> Tensor:
        """The values converted to `dtype` (floats to ints truncate toward zero)."""
        dt = to_dtype(dtype)
        return self if dt == self.dtype else Tensor(UOp(Ops.CAST, dt, (self.uop,)))

    def bitcast(self, dtype: DType | str) -> Tensor:
        """The bits reinterpreted as `dtype` of the same size."""
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise DTypeError(
                f"bitcast needs dtypes of one size: {self.dtype!r} has {self.dtype.itemsize} bytes, "
                f"{dt!r} has {dt.itemsize}"
            )
        return Tensor(UOp(Ops.BITCAST, dt, (self.uop,)))

    def float(self) -> Tensor:
        """Cast to float32."""
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        """Cast to float16."""
        return self.cast(dtypes.float16)

    def int(self) -> Tensor:
        """Cast to int32."""
        return self.cast(dtypes.int32)

    def bool(self) -> Tensor:
        """Cast to bool."""
        return self.cast(dtypes.bool)

    def double(self) -> Tensor:
        """Cast to float64."""
        return self.cast(dtypes.float64)

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16."""
        return self.cast(dtypes.bfloat16)

    def long(self) -> Tensor:
        """Cast to int64."""
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        """Cast to int16."""
        return self.cast(dtypes.int16)

    def char(self) -> Tensor:
        """Cast to int8."""
        return self.cast(dtypes.int8)

    def byte(self) -> Tensor:
        """Cast to uint8."""
        return self.cast(dtypes.uint8)

    def add(self, x: Any, reverse: bool = False) -> Tensor:
        """Elementwise sum."""
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b)

    def sub(self, x: Any, reverse: bool = False) -> Tensor:
        """Elementwise difference."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_bool(a.dtype):
            raise KindError("subtracting bool tensors is not supported; use logical_xor or cast to int first")
        return a._alu(Ops.ADD, b.neg())

    def mul(self, x: Any, reverse: bool = False) -> Tensor:
        """Elementwise product."""
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.AND if dtypes.is_bool(a.dtype) else Ops.MUL, b)

    def div(self, x: Any, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (integer inputs give the default float), or rounded as torch.div's rounding_mode "trunc"
        or "floor" (integers stay integers)."""
        if rounding_mode == "floor":
            return self.floordiv(x, reverse)
        if rounding_mode == "trunc":
            return self.idiv(x, reverse)
        if rounding_mode is not None:
            raise InputError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        a, b = self._broadcasted(x, reverse)
        ft = least_upper_float(a.dtype)
        a, b = a.cast(ft), b.cast(ft)
        return a._alu(Ops.MUL, b.reciprocal())

    def idiv(self, x: Any, reverse: bool = False) -> Tensor:
        """Division rounding toward zero (C semantics) for integers; floats are truncated."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return a.div(b).trunc()
        return a._alu(Ops.IDIV, b)

    def floordiv(self, x: Any, reverse: bool = False) -> Tensor:
        """Floor division, as Python's and torch's `//`."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return a.div(b).floor()
        q = a._alu(Ops.IDIV, b)
        if dtypes.is_unsigned(a.dtype):
            return q
        r = a._alu(Ops.MOD, b)
        adjust = r.ne(0).logical_and((r < 0).ne(b < 0))
        return adjust.where(q - 1, q)

    def mod(self, x: Any, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor, as Python's and torch's `%`."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return a - b * a.div(b).floor()
        r = a._alu(Ops.MOD, b)
        if dtypes.is_unsigned(a.dtype):
            return r
        return (r.ne(0).logical_and((r < 0).ne(b < 0))).where(r + b, r)

    def neg(self) -> Tensor:
        """Elementwise negation."""
        if dtypes.is_bool(self.dtype):
            raise KindError("negating a bool tensor is not supported; use logical_not()")
        return self._alu(Ops.MUL, self._const_like(-1)._broadcast_to(self.shape))

    def reciprocal(self) -> Tensor:
        """1/x."""
        t = self.cast(least_upper_float(self.dtype))
        return t._alu(Ops.RECIP)

    def maximum(self, x: Any) -> Tensor:
        """Elementwise max (NaN propagates)."""
        a, b = self._broadcasted(x)
        return a._alu(Ops.MAX, b)

    def minimum(self, x: Any) -> Tensor:
        """Elementwise min (NaN propagates)."""
        a, b = self._broadcasted(x)
        if not dtypes.is_float(a.dtype):
            # integers: a comparison (-x overflows at the type's minimum)
            return (a < b).where(a, b)
        return a.neg().maximum(b.neg()).neg()

    def where(self, x: Any, y: Any) -> Tensor:
        """`x` where this (bool) tensor is true, else `y`, with broadcasting."""
        cond = self if dtypes.is_bool(self.dtype) else self.ne(0)
        if isinstance(x, Tensor):
            x, y = x._broadcasted(y)
        elif isinstance(y, Tensor):
            y, x = y._broadcasted(x)
        else:
            x = Tensor(x, device=self.device)
            x, y = x._broadcasted(y)
        shape = _broadcast_shape(cond.shape, x.shape)
        c, x, y = cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
        return c._alu(Ops.WHERE, x, y)

    def _cmp(self, op: Ops, x: Any, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._alu(op, b)

    def __lt__(self, x: Any) -> Tensor:
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Any) -> Tensor:
        return self._cmp(Ops.CMPLT, x, reverse=True)

    def __le__(self, x: Any) -> Tensor:
        return self._ordered_or_equal(x, reverse=False)

    def __ge__(self, x: Any) -> Tensor:
        return self._ordered_or_equal(x, reverse=True)

    def _ordered_or_equal(self, x: Any, reverse: bool) -> Tensor:
        """a <= b (or a >= b when reverse): not(b < a) is wrong for NaN, which compares false with everything."""
        a, b = self._broadcasted(x, reverse)
        if not dtypes.is_float(a.dtype):
            return b._alu(Ops.CMPLT, a).logical_not()
        return a._alu(Ops.CMPLT, b).logical_or(a._alu(Ops.CMPNE, b).logical_not())

    def ne(self, x: Any) -> Tensor:
        """Elementwise `!=`."""
        return self._cmp(Ops.CMPNE, x)

    def eq(self, x: Any) -> Tensor:
        """Elementwise `==`."""
        return self.ne(x).logical_not()

    def __eq__(self, x: Any) -> Tensor:  # type: ignore[override]
        return self.eq(x)

    def __ne__(self, x: Any) -> Tensor:  # type: ignore[override]
        return self.ne(x)

    __hash__ = object.__hash__

    def logical_not(self) -> Tensor:
        """Elementwise not of a bool tensor (other dtypes: x == 0)."""
        return self._cmp(Ops.CMPNE, True) if dtypes.is_bool(self.dtype) else self.eq(0)

    def logical_and(self, x: Any) -> Tensor:
        """Elementwise and of bool tensors."""
        a, b = self.bool()._broadcasted(Tensor(x, device=self.device).bool() if not isinstance(x, Tensor) else x.bool())
        return a._alu(Ops.AND, b)

    def logical_or(self, x: Any) -> Tensor:
        """Elementwise or of bool tensors."""
        a, b = self.bool()._broadcasted(Tensor(x, device=self.device).bool() if not isinstance(x, Tensor) else x.bool())
        return a._alu(Ops.OR, b)

    # *** math ***

    def _float_unary(self, op: Ops) -> Tensor:
        t = self.cast(least_upper_float(self.dtype))
        return t._alu(op)

    def exp2(self) -> Tensor:
        """2**x."""
        return self._float_unary(Ops.EXP2)

    def log2(self) -> Tensor:
        """Base-2 logarithm."""
        return self._float_unary(Ops.LOG2)

    def exp(self) -> Tensor:
        """e**x."""
        t = self.cast(least_upper_float(self.dtype))
        return (t * (1 / math.log(2))).exp2()

    def log(self) -> Tensor:
        """Natural logarithm."""
        return self.log2() * math.log(2)

    def sqrt(self) -> Tensor:
        """Square root."""
        return self._float_unary(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        """1/sqrt(x)."""
        return self.sqrt().reciprocal()

    def sin(self) -> Tensor:
        """Sine."""
        return self._float_unary(Ops.SIN)

    def cos(self) -> Tensor:
        """Cosine, as sin(pi/2 - x)."""
        t = self.cast(least_upper_float(self.dtype))
        return (math.pi / 2 - t).sin()

    def tan(self) -> Tensor:
        """Tangent."""
        return self.sin() / self.cos()

    def relu(self) -> Tensor:
        """max(x, 0); nan stays nan, and the gradient at 0 is 0 (torch's: it passes only where x > 0)."""
        return (self <= 0).where(0, self)

    def sigmoid(self) -> Tensor:
        """1 / (1 + e**-x)."""
        t = self.cast(least_upper_float(self.dtype))
        # from e = e**-|x| <= 1, so no intermediate overflows (an inf would make the gradient 0 * inf = nan)
        e = (t.abs() * (-1 / math.log(2))).exp2()
        r = (1 + e).reciprocal()
        return (t >= 0).where(r, e * r)

    def tanh(self) -> Tensor:
        """Hyperbolic tangent, as 2*sigmoid(2x) - 1."""
        return 2.0 * (2.0 * self).sigmoid() - 1.0

    def abs(self) -> Tensor:
        """|x|."""
        if dtypes.is_unsigned(self.dtype) or dtypes.is_bool(self.dtype):
            return self
        return self.maximum(self.neg())

    def square(self) -> Tensor:
        """x*x."""
        return self * self

    def trunc(self) -> Tensor:
        """Round toward zero."""
        return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self) -> Tensor:
        """Round down."""
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Tensor:
        """Round up."""
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    # *** reductions ***

    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
        axes = tuple(range(self.ndim)) if axis is None else tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        axes = tuple(sorted(_unique_axes(axes, self.ndim, "a reduction")))
        if self.ndim == 0:
            return self
        if (ret := split_reduce(self, op, axes)) is None:
            ret = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
        return ret if keepdim else ret.reshape(tuple(d for i, d in enumerate(self.shape) if i not in axes))

    def sum(
        self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | str | None = None
    ) -> Tensor:
        """Sum over `axis` (all by default). Bools and integers sum to int64 (unsigned to uint64), as in torch."""
        if dtype is not None:
            acc = out = to_dtype(dtype)
        elif dtypes.is_bool(self.dtype) or dtypes.is_int(self.dtype):
            acc = out = (
                dtypes.uint64 if dtypes.is_unsigned(self.dtype) and self.dtype == dtypes.uint64 else dtypes.int64
            )
        else:
            acc, out = sum_dtype(self.dtype), self.dtype
        return self.cast(acc)._reduce(Ops.ADD, axis, keepdim).cast(out)

    def prod(
        self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | str | None = None
    ) -> Tensor:
        """Product over `axis`, in `dtype` if given; bools and integers multiply in int64, as in torch."""
        if dtype is not None:
            t = self.cast(dtype)
        else:
            t = self.cast(dtypes.int64) if dtypes.is_bool(self.dtype) or dtypes.is_int(self.dtype) else self
        return t._reduce(Ops.MUL, axis, keepdim)

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Largest value over `axis`."""
        if self.numel() == 0 and (
            axis is None
            or any(self.shape[_normalize_axis(a, self.ndim)] == 0 for a in ((axis,) if isinstance(axis, int) else axis))
        ):
            raise InputError("max of an empty dimension has no value; give an axis with elements")
        if dtypes.is_bool(self.dtype):
            return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Smallest value over `axis`."""
        if not dtypes.is_float(self.dtype):
            # ~x = -1 - x maps the type's minimum to its maximum exactly (-x overflows there); bools: logical not
            return (~(~self).max(axis, keepdim)).cast(self.dtype)
        return self.neg().max(axis, keepdim).neg()

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Average over `axis`; integer inputs give the default float."""
        ft = least_upper_float(self.dtype)
        out = self.cast(ft).sum(axis, keepdim)
        n = self._reduced_count(axis, keepdim)
        # a symbolic count of 0 divides 0 by 0: nan, as an int count of 0 gives
        return out.div(n) if isinstance(n, Tensor) or n else out * math.nan

    # *** linear algebra ***

    def dot(self, w: Tensor) -> Tensor:
        """Matrix product with numpy's/torch's rules for 1-d and batched inputs."""
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise InputError(f"matmul needs at least 1-d tensors, got shapes {x.shape} and {w.shape}")
        k = x.shape[-1]
        kw = w.shape[-2] if w.ndim > 1 else w.shape[0]
        if k != kw:
            raise InputError(f"matmul shapes {x.shape} and {w.shape} don't line up: {k} != {kw}")
        dt = least_upper_dtype(x.dtype, w.dtype)
        x, w = x.cast(dt), w.cast(dt)
        acc = sum_dtype(dt)
        if w.ndim == 2 and math.prod(x.shape[:-1]) == 1 and vector_product(x.device, w.shape[-1]):
            # one row times a matrix (a decoding step's x @ W): (k, 1) * (k, m) summed over k, the reduced axis ahead
            # of the kept one as in W's memory, so that the reduction is cut along k into parts like a column
            # reduction (split_reduce) rather than left to one workgroup per few columns
            out = (x.reshape(k, 1) * w).cast(acc)._reduce(Ops.ADD, 0, False).cast(dt)
            return out.reshape(*x.shape[:-1], w.shape[-1])
        if w.ndim == 1:
            a, b = x._broadcasted(w)  # (..., k) * (k,), summed over k
        else:
            # (..., n, 1, k) * (..., m, k) broadcast to (..., n, m, k), summed over k; a 1-d x has no n axis
            wt = w.transpose(-1, -2)
            if x.ndim > 1:
                x, wt = x.reshape(*x.shape[:-1], 1, k), wt.reshape(*wt.shape[:-2], 1, *wt.shape[-2:])
            a, b = x._broadcasted(wt)
        return (a * b).cast(acc)._reduce(Ops.ADD, -1, False).cast(dt)

    def matmul(self, w: Tensor) -> Tensor:
        """Alias of dot."""
        return self.dot(w)

    # *** operators ***

    def __add__(self, x: Any) -> Tensor:
        return self.add(x)

    def __radd__(self, x: Any) -> Tensor:
        return self.add(x, True)

    def __sub__(self, x: Any) -> Tensor:
        return self.sub(x)

    def __rsub__(self, x: Any) -> Tensor:
        return self.sub(x, True)

    def __mul__(self, x: Any) -> Tensor:
        return self.mul(x)

    def __rmul__(self, x: Any) -> Tensor:
        return self.mul(x, True)

    def __truediv__(self, x: Any) -> Tensor:
        return self.div(x)

    def __rtruediv__(self, x: Any) -> Tensor:
        return self.div(x, True)

    def __floordiv__(self, x: Any) -> Tensor:
        return self.floordiv(x)

    def __rfloordiv__(self, x: Any) -> Tensor:
        return self.floordiv(x, True)

    def __mod__(self, x: Any) -> Tensor:
        return self.mod(x)

    def __rmod__(self, x: Any) -> Tensor:
        return self.mod(x, True)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.dot(x)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        return x.dot(self)

    def __invert__(self) -> Tensor:
        if dtypes.is_bool(self.dtype):
            return self.logical_not()
        if not dtypes.is_int(self.dtype):
            raise KindError(f"~ needs an integer or bool tensor, got {self.dtype!r}")
        return self._alu(Ops.XOR, self._const_like(-1)._broadcast_to(self.shape))

    def __and__(self, x: Any) -> Tensor:
        return self.bitwise_and(x)

    def __or__(self, x: Any) -> Tensor:
        return self.bitwise_or(x)

    def __xor__(self, x: Any) -> Tensor:
        return self.bitwise_xor(x)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())


class no_grad(ContextDecorator):  # noqa: N801 - torch's name
    """`with lazygrad.no_grad():` (or as a decorator): results computed inside are cut from autograd, as if
    `.detach()`ed, so no later `backward()` reaches through them. Sets `Tensor.no_grad` and restores it after."""

    def __enter__(self) -> None:
        self.prev, Tensor.no_grad = Tensor.no_grad, True

    def __exit__(self, *exc: object) -> None:
        Tensor.no_grad = self.prev


class _HostView:
    """Device memory seen by numpy without a copy. The array's base is this object, which holds the Buffer, so the
    memory can't return to the allocator's cache (and be reused) while the array lives; the array is read-only."""

    def __init__(self, view: memoryview, buf: Buffer, npdt: np.dtype) -> None:
        self._view, self._buf = view, buf
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        self.__array_interface__ = {"shape": (buf.size,), "typestr": npdt.str, "data": (address, True), "version": 3}


def _separate_twins(tensors: list[Tensor]) -> None:
    """Give each tensor about to be realized whose graph is the very node of another live tensor (equal graphs built
    apart, e.g. `Tensor.zeros(3)` twice, are one node) a node of its own, so that it gets a buffer of its own:
    otherwise realizing one would store both in one buffer, and an assign to one would change the other."""
    pending = {id(t): t for t in tensors if t.uop.op is not Ops.ASSIGN and not _stored(t.uop)}
    if not pending:
        return
    users: dict[UOp, int] = {}
    for t in list(_all_tensors):
        users[t.uop] = users.get(t.uop, 0) + 1
    for t in pending.values():
        if users[t.uop] > 1:
            t.uop = _own_node(t.uop)


def _stored(u: UOp) -> bool:
    """Whether `u` needs no kernel to be realized: a view of a leaf, or on several devices, views of leaves."""
    return all(is_view_of_leaf(p) for p in device_uops(u))


_own_ids = itertools.count()


def _own_node(u: UOp) -> UOp:
    """A node with the value of `u` that no other graph has: a CONTIGUOUS whose arg is a fresh id (a plain CONTIGUOUS
    has none), so it stores its own buffer when realized; a CONST gets a buffer of its own at once."""
    if u.op is Ops.MULTI:
        return u.replace(src=tuple(_own_node(p) for p in u.src))
    if u.op is Ops.CONST:
        return _unique_const(u)
    if u.op is Ops.CONTIGUOUS:
        return u.replace(arg=next(_own_ids))
    return UOp(Ops.CONTIGUOUS, u.dtype, (u,), next(_own_ids))


def _unique_const(c: UOp) -> UOp:
    """A constant in its own buffer: CONST nodes are interned, so one that requires grad would otherwise be the same
    node as every equal constant in the graph and collect their gradients too."""
    return _from_numpy(np.array(c.arg, dtype=_np_storage(c.dtype)), device_of(c) or Device.DEFAULT, c.dtype)


_NONZERO_AT_ZERO = frozenset({Ops.EXP2, Ops.LOG2, Ops.RECIP, Ops.IDIV, Ops.MOD, Ops.THREEFRY})


def _nonzero_at_zero(u: UOp) -> bool:
    """True when `u` computes something nonzero from all-zero inputs (exp, reciprocal, log, integer division)."""
    return any(n.op in _NONZERO_AT_ZERO for n in u.toposort)


def _detached(u: UOp) -> UOp:
    """`u` cut from autograd, with the DETACH under its movement ops: a view of a value stays a view of it (realizing
    a DETACH over a permute would store a copy in the new layout)."""
    chain = []
    while u.op in _MOVEMENT:
        chain.append(u)
        u = u.src[0]
    u = UOp(Ops.DETACH, u.dtype, (u,))
    for m in reversed(chain):
        u = m.replace(src=(u,))
    return u


_MOVEMENT = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP})


def _int_holding(dt: DType, lo: Any, hi: Any) -> DType:
    """The inferred dtype `dt` widened so that integers in [lo, hi] keep their values: int64 (torch's integer type)
    past int32's range; past int64's, an error rather than wrapped values."""
    if dt != dtypes.default_int or isinstance(lo, (bool, float)) or isinstance(hi, (bool, float)):
        return dt
    lo, hi = int(lo), int(hi)
    if dtypes.min(dt) <= lo and hi <= dtypes.max(dt):
        return dt
    if lo < dtypes.min(dtypes.int64) or hi > dtypes.max(dtypes.int64):
        raise OverflowError(f"integer {lo if lo < 0 else hi} doesn't fit int64; pass a float dtype or smaller values")
    return dtypes.int64


def _np_storage(dt: DType) -> Any:
    try:
        return to_numpy_dtype(dt)
    except DTypeError:
        return np.float32  # bfloat16/fp8 data enters as float32 and is cast on the device


def _from_numpy(arr: np.ndarray, device: str, dtype: DType) -> UOp:
    """A VIEW of a new BUFFER filled with `arr`."""
    storage_dt = from_numpy_dtype(arr.dtype)
    shape = arr.shape  # ascontiguousarray makes 0-d arrays 1-d
    arr = np.ascontiguousarray(arr)
    buf_uop = new_buffer(device, arr.size, storage_dt)
    buf = buffer_of(buf_uop).allocate()
    if arr.size:
        buf.copyin(memoryview(arr.reshape(-1)).cast("B"))
    attach_buffer(buf_uop, buf)
    uop = UOp(Ops.VIEW, storage_dt, (buf_uop,), ShapeTracker.from_shape(shape))
    return uop if storage_dt == dtype else UOp(Ops.CAST, dtype, (uop,))


def _shape_arg(shape: Any) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    if isinstance(shape, int):
        shape = (shape,)
    # symbolic sizes (bound variables, see lazygrad.Variable) stay UOps
    return tuple(s if isinstance(s, UOp) else _int_size(s) for s in shape)


def _int_size(s: Any) -> int:
    """A size or dimension given as an int (numpy ints too); a float or tensor there is a mistake, not rounded."""
    try:
        return operator.index(s)
    except TypeError:
        raise KindError(f"sizes and dimensions must be ints, got {type(s).__name__} {s!r}") from None


def _creation_shape(shape: Any, what: str) -> tuple[int, ...]:
    """The shape argument of a creation function: ints (or symbolic sizes), none negative."""
    out = _shape_arg(shape)
    if any(isinstance(s, int) and s < 0 for s in out):
        raise InputError(f"{what} needs non-negative sizes, got shape {out}")
    return out


def _unique_axes(axes: Sequence[Any], ndim: int, what: str) -> set[int]:
    """`axes` normalized to [0, ndim), each at most once (torch rejects a dimension given twice)."""
    out: set[int] = set()
    for a in axes:
        d = _normalize_axis(a, ndim)
        if d in out:
            raise InputError(f"{what} got dimension {d} more than once in {tuple(axes)}; give each dimension once")
        out.add(d)
    return out


def _sint(x: Any) -> Any:
    """A size argument: a symbolic size (UOp) as it is, anything else as an int."""
    return x if isinstance(x, UOp) else int(x)


def _pad_pairs(padding: Sequence[Any], ndim: int) -> tuple[tuple[int, int], ...]:
    if all(isinstance(p, (tuple, list)) or p is None for p in padding):
        if len(padding) != ndim:
            raise InputError(f"pad needs one (before, after) pair per dimension ({ndim}), got {len(padding)}")
        return tuple((0, 0) if p is None else (_sint(p[0]), _sint(p[1])) for p in padding)
    if len(padding) % 2 or len(padding) // 2 > ndim:
        raise InputError(f"flat padding {tuple(padding)} needs (left, right) pairs for at most {ndim} dimensions")
    flat = list(padding) + [0] * (2 * ndim - len(padding))
    # torch's flat form starts at the last dimension
    return tuple((_sint(flat[2 * i]), _sint(flat[2 * i + 1])) for i in range(ndim))[::-1]


def _takes_requires_grad(make: Any) -> Any:
    """`make` (a creation function) also taking `requires_grad=`, as torch's and tinygrad's do."""

    @functools.wraps(make)
    def made(*args: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        out = make(*args, **kwargs)
        return out if requires_grad is None else out.requires_grad_(requires_grad)

    return made


# one wrapper over the creation functions instead of the same two lines in each of them
for _name in ("full", "zeros", "ones", "empty", "arange", "eye", "linspace"):
    setattr(Tensor, _name, staticmethod(_takes_requires_grad(getattr(Tensor, _name))))
for _name in ("full_like", "zeros_like", "ones_like"):
    setattr(Tensor, _name, _takes_requires_grad(getattr(Tensor, _name)))
