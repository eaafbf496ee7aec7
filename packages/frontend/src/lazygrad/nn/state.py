"""Model state: finding a model's tensors by name, loading them, and the file formats weights come in.

- `get_state_dict(model)` / `get_parameters(model)`: the tensors of any object, named by attribute path as
  PyTorch names them (`layers.0.weight`); `load_state_dict(model, state_dict)` copies values into them.
- `safe_save` / `safe_load`: the safetensors format (an 8-byte little-endian header length, a JSON header saying
  each tensor's dtype, shape and byte range, then the raw little-endian data), read and written here.
- `torch_load`: PyTorch `.pth`/`.pt` checkpoints (the zip format and the older single-pickle format) read without
  torch, through an unpickler that builds only tensors, storages and plain containers.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from lazygrad.errors import InputError
from lazygrad.tensor import Tensor
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.tensor_graph import attach_buffer, buffer_of, is_view_of_leaf, new_buffer
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

__all__ = [
    "get_parameters",
    "get_state_dict",
    "load_state_dict",
    "safe_load",
    "safe_metadata",
    "safe_save",
    "torch_load",
]

# *** state dicts ***


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every Tensor (every `tensor_type`) reachable from `obj` through attributes, lists, tuples and dicts, by its
    dotted path."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()

    def visit(o: Any, path: str) -> None:
        if isinstance(o, tensor_type):
            out[path.strip(".")] = o
            return
        if id(o) in seen or isinstance(o, (str, bytes, int, float, bool, type(None))):
            return
        seen.add(id(o))
        if hasattr(o, "_asdict"):  # a namedtuple: its field names, not its positions
            o = o._asdict()
        if isinstance(o, dict):
            for k, v in o.items():
                visit(v, f"{path}{k}.")
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                visit(v, f"{path}{i}.")
        elif hasattr(o, "__dict__"):
            visit(vars(o), path)

    visit(obj, prefix)
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    """Every distinct Tensor of `obj` (see get_state_dict), in attribute order: what an optimizer takes."""
    seen: set[int] = set()
    return [t for t in get_state_dict(obj).values() if not (id(t) in seen or seen.add(id(t)))]


def load_state_dict(
    model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = False, consume: bool = False
) -> None:
    """Copy `state_dict`'s tensors into the model's tensors of the same names, cast to their dtypes and devices (a
    copy: the model never shares memory with the state dict).

    strict: a model tensor missing from state_dict raises KeyError (otherwise it keeps its value). A shape that
    differs always raises. consume: delete each entry from state_dict once loaded, to free its memory early.
    """
    model_state = get_state_dict(model)
    missing = [k for k in model_state if k not in state_dict]
    if strict and missing:
        raise KeyError(f"the state dict has no {missing}; pass strict=False to keep the model's values for them")
    loaded = []
    for k, v in model_state.items():
        if k not in state_dict:
            continue
        src = state_dict[k]
        if not isinstance(src, Tensor):
            src = Tensor(np.asarray(src))
        if src.shape != v.shape:
            raise InputError(f"{k}: the state dict has shape {src.shape}, the model {v.shape}")
        if not is_view_of_leaf(v.uop):
            # memory of its own: sharing the state dict's buffer would tie this model to every other user of it
            v.uop = Tensor.empty(*v.shape, dtype=v.dtype, device=v.device).uop
        v.assign(src.to(v.device).cast(v.dtype))
        loaded.append(v)
        if consume:
            del state_dict[k]
    if loaded:
        Tensor.realize(*loaded)
    if verbose:
        unused = [k for k in state_dict if k not in model_state]
        print(f"load_state_dict: {len(loaded)} tensors loaded, missing {missing}, unused {unused}")


# *** safetensors ***

SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool,
    "U8": dtypes.uint8,
    "I8": dtypes.int8,
    "U16": dtypes.uint16,
    "I16": dtypes.int16,
    "U32": dtypes.uint32,
    "I32": dtypes.int32,
    "U64": dtypes.uint64,
    "I64": dtypes.int64,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F32": dtypes.float32,
    "F64": dtypes.float64,
    "F8_E4M3": dtypes.fp8e4m3,
    "F8_E5M2": dtypes.fp8e5m2,
}
_SAFETENSORS_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


class SafetensorsError(ValueError):
    """A file is not valid safetensors (or uses a dtype lazygrad does not have)."""


def _numpy_dtype(dtype: DType) -> np.dtype | None:
    try:
        return np.dtype(to_numpy_dtype(dtype))
    except TypeError:
        return None  # bfloat16 and fp8 have no numpy type


def _to_bytes(t: Tensor) -> bytes:
    """The values of `t` as little-endian bytes, row-major."""
    npdt = _numpy_dtype(t.dtype)
    if npdt is not None:
        return np.ascontiguousarray(t.numpy()).astype(npdt.newbyteorder("<"), copy=False).tobytes()
    # no numpy type: the bytes as the device holds them (little-endian, as every device we run on), from the buffer
    # itself when the tensor lies densely at its start, else from a dense copy
    buf, st = (t if is_view_of_leaf(t.uop) else t.contiguous())._buffer_view()
    if not st.contiguous:
        buf, st = t.contiguous()._buffer_view()
    whole = bytearray(buf.nbytes)
    if whole:
        buf.copyout(memoryview(whole))
    return bytes(whole[: t.nbytes])


def _from_bytes(data: bytes | memoryview, dtype: DType, shape: tuple[int, ...], device: str | None) -> Tensor:
    """A tensor of `dtype` and `shape` holding little-endian bytes `data` (copied into a new device buffer)."""
    npdt = _numpy_dtype(dtype)
    if npdt is not None:
        arr = np.frombuffer(data, dtype=npdt.newbyteorder("<")).astype(npdt, copy=False).reshape(shape)
        return Tensor(arr, device=device)
    # no numpy type, no conversion: the bytes go into a buffer of the dtype as they are
    dev = Device.select(device) if device is not None else Device.DEFAULT
    buf_uop = new_buffer(dev, math.prod(shape), dtype)
    buf = buffer_of(buf_uop).allocate()
    if len(data):
        buf.copyin(memoryview(bytearray(data)))
    attach_buffer(buf_uop, buf)
    return Tensor(UOp(Ops.VIEW, dtype, (buf_uop,), ShapeTracker.from_shape(shape)))


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to `fn` in the safetensors format (`metadata`: optional string pairs for the header)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, t in tensors.items():
        if t.dtype not in _SAFETENSORS_NAMES:
            raise SafetensorsError(f"{name}: safetensors has no dtype {t.dtype!r}")
        data = _to_bytes(t)
        span = [offset, offset + len(data)]
        header[name] = {"dtype": _SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": span}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as the reference writer does
    with open(fn, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def _read_header(buf: memoryview, fn: Any) -> tuple[dict[str, Any], int]:
    if len(buf) < 8:
        raise SafetensorsError(f"{fn} is too short to be a safetensors file")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise SafetensorsError(f"{fn}: the header length {n} runs past the end of the file ({len(buf)} bytes)")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{fn}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{fn}: the header must be a JSON object")
    return header, 8 + n


def safe_load(fn: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
    """The tensors of safetensors file `fn`, by name, on `device` (default: the default device)."""
    with open(fn, "rb") as f:
        buf = memoryview(f.read())
    header, start = _read_header(buf, fn)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise SafetensorsError(f"{fn}: {name} has dtype {info['dtype']}, which lazygrad does not have")
        dtype, shape = SAFETENSORS_DTYPES[info["dtype"]], tuple(info["shape"])
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(buf) - start or end - begin != int(np.prod(shape)) * dtype.itemsize:
            raise SafetensorsError(f"{fn}: {name} has data_offsets {[begin, end]} that don't fit {shape} {dtype!r}")
        out[name] = _from_bytes(buf[start + begin : start + end], dtype, shape, device)
    return out


def safe_metadata(fn: str | os.PathLike) -> dict[str, str]:
    """The `__metadata__` string pairs of safetensors file `fn` (empty if it has none)."""
    with open(fn, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header, _ = _read_header(memoryview(struct.pack("<Q", n) + f.read(n)), fn)
    return header.get("__metadata__", {})


# *** PyTorch checkpoints ***

_TORCH_STORAGES: dict[str, DType] = {
    "DoubleStorage": dtypes.float64,
    "FloatStorage": dtypes.float32,
    "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16,
    "LongStorage": dtypes.int64,
    "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16,
    "CharStorage": dtypes.int8,
    "ByteStorage": dtypes.uint8,
    "BoolStorage": dtypes.bool,
    "Float8_e4m3fnStorage": dtypes.fp8e4m3,
    "Float8_e5m2Storage": dtypes.fp8e5m2,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class TorchLoadError(ValueError):
    """A checkpoint is not in a format torch_load reads, or holds objects other than tensors and containers."""


@dataclass(frozen=True)
class _StorageType:
    dtype: DType


@dataclass
class _Storage:
    dtype: DType
    key: str
    data: bytes | None = None


@dataclass(frozen=True)
class _PendingTensor:
    """A tensor to build once its storage's bytes are known (the legacy format stores them after the pickle)."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple, stride: tuple, *_: Any) -> _PendingTensor:
    return _PendingTensor(storage, offset, tuple(size), tuple(stride))


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
}


class _TorchUnpickler(pickle.Unpickler):
    """Builds only what a checkpoint of tensors needs; any other class is refused, so loading runs no foreign code."""

    def __init__(self, f: IO[bytes], storages: dict[str, _Storage]) -> None:
        super().__init__(f)
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _TORCH_STORAGES:
            return _StorageType(_TORCH_STORAGES[name])
        if (module, name) in _ALLOWED_GLOBALS:
            return _ALLOWED_GLOBALS[(module, name)]
        raise TorchLoadError(
            f"the checkpoint needs {module}.{name}, which torch_load does not build: save the state_dict() (tensors "
            "and plain containers) rather than whole objects"
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise TorchLoadError(f"unknown persistent id {pid!r} in the checkpoint")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise TorchLoadError(f"unsupported storage type {storage_type!r}")
        return self.storages.setdefault(key, _Storage(storage_type.dtype, key))


def _materialize(obj: Any, little_endian: bool, device: str | None) -> Any:
    """`obj` with every pending tensor built from its storage's bytes."""
    if isinstance(obj, _PendingTensor):
        return _build_tensor(obj, little_endian, device)
    if isinstance(obj, OrderedDict):
        return OrderedDict((k, _materialize(v, little_endian, device)) for k, v in obj.items())
    if isinstance(obj, dict):
        return {k: _materialize(v, little_endian, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_materialize(v, little_endian, device) for v in obj)
    return obj


def _build_tensor(p: _PendingTensor, little_endian: bool, device: str | None) -> Tensor:
    st = p.storage
    assert st.data is not None, f"storage {st.key} was never read"
    item = st.dtype.itemsize
    # strided views of storage elements, through an unsigned integer of the element size (no conversion)
    carrier = np.dtype(f"{'<' if little_endian else '>'}u{item}") if item > 1 else np.dtype(np.uint8)
    flat = np.frombuffer(st.data, dtype=carrier)
    if 0 not in p.size and p.offset + sum((n - 1) * s for n, s in zip(p.size, p.stride)) >= len(flat):
        raise TorchLoadError(f"a tensor of size {p.size} runs past the end of storage {st.key}")
    view = np.lib.stride_tricks.as_strided(
        flat[p.offset :], shape=p.size, strides=tuple(s * item for s in p.stride), writeable=False
    )
    return _from_bytes(view.astype(carrier.newbyteorder("<")).tobytes(), st.dtype, p.size, device)


def torch_load(fn: str | os.PathLike, device: str | None = None) -> Any:
    """The object saved by `torch.save` in `fn` (usually a state dict), with its tensors as lazygrad Tensors.

    Reads the zip format (torch >= 1.6) and the older single-pickle format; torch itself is not needed.
    Only tensors and plain containers are built: a checkpoint of whole modules or other classes is refused.
    """
    if zipfile.is_zipfile(fn):
        with zipfile.ZipFile(fn) as z:
            names = z.namelist()
            pkl = next((n for n in names if n.endswith("data.pkl")), None)
            if pkl is None:
                raise TorchLoadError(f"{fn} is a zip file without data.pkl: not a PyTorch checkpoint")
            root = pkl[: -len("data.pkl")]
            order = z.read(root + "byteorder").decode() if root + "byteorder" in names else "little"
            storages: dict[str, _Storage] = {}
            with z.open(pkl) as f:
                obj = _TorchUnpickler(f, storages).load()
            for st in storages.values():
                st.data = z.read(f"{root}data/{st.key}")
        return _materialize(obj, order == "little", device)
    with open(fn, "rb") as f:
        storages = {}

        def load() -> Any:
            return _TorchUnpickler(f, storages).load()

        try:
            magic = load()
        except (pickle.UnpicklingError, EOFError, ValueError):
            magic = None
        if magic != _LEGACY_MAGIC:
            raise TorchLoadError(f"{fn} is not a PyTorch checkpoint (neither the zip nor the legacy format)")
        load()  # the protocol version
        sys_info = load()
        little = sys_info.get("little_endian", True) if isinstance(sys_info, dict) else True
        obj = load()
        for key in load():
            (numel,) = struct.unpack("<q" if little else ">q", f.read(8))
            st = storages[str(key)]
            st.data = f.read(numel * st.dtype.itemsize)
    return _materialize(obj, little, device)
