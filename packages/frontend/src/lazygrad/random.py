"""Random numbers of `Tensor`: counter-based, so the same seed gives the same values on every device.

Each call draws from its own stream: element i of the c-th call on a device since `Tensor.manual_seed(seed)` is
Threefry-2x32 (20 rounds, Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) of the counter
(i, c) under the key (seed mod 2**32, seed >> 32). Threefry is only 32-bit adds, xors and rotations, which every
device computes bit-exactly, and nothing is generated on the host. Floats take the top bits of a word: exactly
representable multiples of 2**-(mantissa bits + 1) in [0, 1). Normals use Box-Muller on the two words of one counter.

The key and the call count live on each device, in a uint32 tensor [key low, key high, calls] that every call reads
and advances with an `assign`. So the advance is a kernel like any other: a `TinyJit` captures it, and each replay of
a jitted function that draws random numbers draws the next ones, the same sequence as without the JIT.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from lazygrad.engine import device_of_name
from lazygrad.errors import InputError
from lazygrad_uop.dtype import DType, DTypeError, dtypes, to_dtype

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA  # Threefry's key-schedule constant
_MASK32 = 0xFFFFFFFF
_IOTA_CHUNK = 1 << 12  # counters are built from two small uploaded aranges, not one as long as the tensor


def threefry2x32(key: tuple[int | Tensor, int | Tensor], x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    """Threefry-2x32 with 20 rounds of the counter words (x0, x1) (uint32 tensors of one shape) under `key`: two
    Python ints, or two uint32 tensors that broadcast to the counters' shape (a key kept on the device)."""
    k0, k1 = key
    if isinstance(k0, int) and isinstance(k1, int):
        ks: tuple[Any, Any, Any] = (k0 & _MASK32, k1 & _MASK32, (k0 ^ k1 ^ _PARITY) & _MASK32)
    else:
        ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for block in range(5):
        for r in _ROTATIONS[4 * (block % 2) : 4 * (block % 2) + 4]:
            x0 = x0 + x1
            x1 = (x1 << r) | (x1 >> (32 - r))
            x1 = x1 ^ x0
        # key injection after every 4 rounds (uint32 tensors wrap by themselves, Python ints are masked)
        inject = ks[(block + 2) % 3] + block + 1
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + (inject & _MASK32 if isinstance(inject, int) else inject)
    return x0, x1


def _shape(shape: Any) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    out = tuple(int(s) for s in shape)
    if any(s < 0 for s in out):
        raise InputError(f"random tensor sizes must be non-negative, got {out}")
    return out


def _bits_to_unit(word: Tensor, dt: DType) -> Tensor:
    """A uint32 word as a float of dtype `dt` in [0, 1): its top (mantissa + 1) bits times 2**-(mantissa + 1)."""
    bits = min(dtypes.finfo(dt)[1] + 1, 24)
    return (word >> (32 - bits)).cast(dt) * (2.0**-bits)


class RandomMixin:
    """Random-number constructors of `Tensor` (mixed into it; see `lazygrad.tensor`)."""

    __slots__ = ()

    _seed: ClassVar[int] = 0
    _rng_state: ClassVar[dict[str, Tensor]] = {}
    """Per device: the realized uint32 tensor [key low, key high, calls] that the next random call reads."""

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Seed the generator: the random tensors made after this are the same on every run and every device.

        The devices' generator states are overwritten in place (realized at once), so a jitted function sees the
        new seed on its next replay, and a `manual_seed` inside a jitted function resets the generator on every
        call."""
        if not 0 <= seed < 2**64:
            raise InputError(f"seed must be in [0, 2**64), got {seed}")
        RandomMixin._seed = int(seed)
        for device, state in RandomMixin._rng_state.items():
            state.assign(cls._seeded_state(device)).realize()

    @classmethod
    def _seeded_state(cls, device: str) -> Tensor:
        seed = RandomMixin._seed
        return cls(np.array([seed & _MASK32, seed >> 32, 0], dtype=np.uint32), device=device, requires_grad=False)

    @classmethod
    def _next_stream(cls, device: str | None) -> tuple[Tensor, Tensor, Tensor]:
        """The two key words and the call index of this call (uint32 scalars), and the device's state advanced.

        They are read from a copy of the state, taken and advanced in one realize before anything reads them: a
        random tensor that stays lazy while later calls advance the state must still see its own call index."""
        dev = device_of_name(device)
        state = RandomMixin._rng_state.get(dev)
        if state is None:
            state = RandomMixin._rng_state[dev] = cls._seeded_state(dev)
        snapshot = state.contiguous()
        one_more_call = cls.ones(1, dtype=dtypes.uint32, device=dev).pad(((2, 0),))
        state.assign(state + one_more_call)
        cls.realize(snapshot, state)
        k0, k1, call = (snapshot.shrink(((i, i + 1),)).reshape(()) for i in range(3))
        return k0, k1, call

    @classmethod
    def _iota(cls, n: int, device: str | None) -> Tensor:
        """0..n-1 as uint32, from two short uploaded aranges (so a large random tensor needs no large upload)."""
        if n <= _IOTA_CHUNK:
            return cls.arange(n, dtype=dtypes.uint32, device=device)
        rows = math.ceil(n / _IOTA_CHUNK)
        hi = cls._iota(rows, device) * _IOTA_CHUNK
        lo = cls.arange(_IOTA_CHUNK, dtype=dtypes.uint32, device=device)
        return (hi.reshape(rows, 1) + lo.reshape(1, _IOTA_CHUNK)).reshape(-1).shrink(((0, n),))

    @classmethod
    def _random_words(cls, shape: tuple[int, ...], device: str | tuple[str, ...] | None) -> tuple[Tensor, Tensor]:
        """Two uint32 words of random bits per element: the next stream of the generator."""
        if isinstance(device, (tuple, list)):
            # on several devices: the first device's stream, replicated, so the values are those of one device
            x0, x1 = cls._random_words(shape, device[0])
            return x0.shard(device), x1.shard(device)
        n = math.prod(shape)
        if n >= 2**32:
            raise InputError(f"a random tensor can have at most 2**32 - 1 elements, {shape} has {n}")
        k0, k1, call = cls._next_stream(device)
        counter = cls._iota(n, device)
        x0, x1 = threefry2x32((k0, k1), counter, call.reshape(1).expand(n))
        return x0.reshape(shape), x1.reshape(shape)

    @staticmethod
    def _float_dtype(dtype: DType | str | None, what: str) -> DType:
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if not dtypes.is_float(dt):
            raise DTypeError(f"{what} makes floating-point values; got dtype {dt!r}")
        return dt

    @staticmethod
    def _finish(t: Tensor, contiguous: bool, requires_grad: bool | None) -> Tensor:
        out = t.contiguous() if contiguous else t
        if requires_grad is not None:
            out.requires_grad_(requires_grad)
        return out

    @classmethod
    def rand(
        cls,
        *shape: Any,
        dtype: DType | str | None = None,
        device: str | None = None,
        contiguous: bool = True,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """Uniform random values in [0, 1). contiguous=False leaves the generator fused into the kernels that
        read it (each recomputes it) instead of storing the values once."""
        dt = cls._float_dtype(dtype, "rand")
        sh = _shape(shape)
        x0, x1 = cls._random_words(sh, device)
        if dt == dtypes.float64:
            # 53 bits: 21 from the first word, 32 from the second
            hi, lo = (x0 >> 11).cast(dt), x1.cast(dt)
            vals = hi * 2.0**-21 + lo * 2.0**-53
        else:
            vals = _bits_to_unit(x0, dt)
        return cls._finish(vals, contiguous, requires_grad)

    @classmethod
    def randn(
        cls,
        *shape: Any,
        dtype: DType | str | None = None,
        device: str | None = None,
        contiguous: bool = True,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """Standard normal random values (Box-Muller on two uniform words, computed in float32 or wider)."""
        dt = cls._float_dtype(dtype, "randn")
        work = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
        x0, x1 = cls._random_words(_shape(shape), device)
        u1 = 1.0 - _bits_to_unit(x0, work)  # in (0, 1]: log(u1) is finite
        u2 = _bits_to_unit(x1, work)
        vals = ((-2.0 * u1.log()).sqrt() * (u2 * (2 * math.pi)).cos()).cast(dt)
        return cls._finish(vals, contiguous, requires_grad)

    @classmethod
    def randint(
        cls,
        *shape: Any,
        low: int = 0,
        high: int = 10,
        dtype: DType | str | None = None,
        device: str | None = None,
        contiguous: bool = True,
    ) -> Tensor:
        """Uniform random integers in [low, high) (tinygrad's signature: shape first, bounds by keyword)."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.int32
        if not dtypes.is_int(dt):
            raise DTypeError(f"randint makes integers; got dtype {dt!r}")
        if high <= low:
            raise InputError(f"randint needs low < high, got low={low}, high={high}")
        span = high - low
        x0, x1 = cls._random_words(_shape(shape), device)
        if span <= 2**32:
            # the remainder's bias is below span / 2**32; the same on every device
            offset = (x0.cast(dtypes.uint64) % span) if span < 2**32 else x0.cast(dtypes.uint64)
        else:
            wide = x0.cast(dtypes.uint64) << 32 | x1.cast(dtypes.uint64)
            offset = wide % span
        vals = (offset.cast(dtypes.int64) + low).cast(dt)
        return cls._finish(vals, contiguous, None)

    @classmethod
    def uniform(
        cls,
        *shape: Any,
        low: float = 0.0,
        high: float = 1.0,
        dtype: DType | str | None = None,
        device: str | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """Uniform random values in [low, high)."""
        dt = cls._float_dtype(dtype, "uniform")
        u = cls.rand(*shape, dtype=dt, device=device, contiguous=False)
        return cls._finish(u * (high - low) + low, kwargs.get("contiguous", True), kwargs.get("requires_grad"))

    @classmethod
    def normal(
        cls,
        *shape: Any,
        mean: float = 0.0,
        std: float = 1.0,
        dtype: DType | str | None = None,
        device: str | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """Normal random values with `mean` and `std`."""
        dt = cls._float_dtype(dtype, "normal")
        z = cls.randn(*shape, dtype=dt, device=device, contiguous=False)
        return cls._finish(z * std + mean, kwargs.get("contiguous", True), kwargs.get("requires_grad"))

    @classmethod
    def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """Uniform in [-1, 1) scaled by 1/sqrt(number of elements)."""
        sh = _shape(shape)
        return cls.uniform(*sh, low=-1.0, high=1.0, **kwargs) * (math.prod(sh) ** -0.5)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """Glorot (Xavier) uniform: bound sqrt(6 / (fan_in + fan_out)), fan_out = shape[0], fan_in the rest."""
        sh = _shape(shape)
        bound = math.sqrt(6 / (sh[0] + math.prod(sh[1:])))
        return cls.uniform(*sh, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """He uniform for leaky-relu slope `a`: bound sqrt(3) * sqrt(2 / (1 + a**2)) / sqrt(fan_in)."""
        sh = _shape(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(math.prod(sh[1:]))
        return cls.uniform(*sh, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """He normal for leaky-relu slope `a`: std sqrt(2 / (1 + a**2)) / sqrt(fan_in)."""
        sh = _shape(shape)
        std = math.sqrt(2.0 / (1 + a**2)) / math.sqrt(math.prod(sh[1:]))
        return cls.normal(*sh, mean=0.0, std=std, **kwargs)

    def rand_like(self: Tensor, **kwargs: Any) -> Tensor:
        """rand of this tensor's shape, dtype (if floating) and device."""
        dt = kwargs.pop("dtype", self.dtype if dtypes.is_float(self.dtype) else None)
        return type(self).rand(*self.shape, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)

    def randn_like(self: Tensor, **kwargs: Any) -> Tensor:
        """randn of this tensor's shape, dtype (if floating) and device."""
        dt = kwargs.pop("dtype", self.dtype if dtypes.is_float(self.dtype) else None)
        return type(self).randn(*self.shape, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)

    @classmethod
    def randperm(cls, n: int, device: str | None = None, dtype: DType | str = dtypes.int64) -> Tensor:
        """A random permutation of 0..n-1 (the order that sorts n random words)."""
        words, _ = cls._random_words((n,), device)
        return words.argsort().cast(to_dtype(dtype))

    def multinomial(self: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Indices (int64) drawn from the categorical distribution(s) of the weights in the last dimension (1-d or
        2-d, as torch.multinomial): with replacement by inverting the CDF, without by Gumbel top-k."""
        if self.ndim not in (1, 2):
            raise InputError(f"multinomial needs a 1-d or 2-d tensor of weights, got shape {self.shape}")
        w = self if self.ndim == 2 else self.unsqueeze(0)
        rows, k = w.shape
        if not replacement and num_samples > k:
            raise InputError(f"can't draw {num_samples} samples without replacement from {k} categories")
        w = w.cast(dtypes.float32)
        cls = type(self)
        if replacement:
            cdf = w.cumsum(1)
            u = cls.rand(rows, num_samples, device=self.device, contiguous=False) * cdf[:, -1:]
            out = (cdf.unsqueeze(1) <= u.unsqueeze(-1)).sum(-1).minimum(k - 1)
        else:
            u = cls.rand(rows, k, device=self.device, contiguous=False)
            gumbel = -(-(1.0 - u).log()).log()
            keys = (w > 0).where(w.log() + gumbel, -math.inf)
            out = keys.topk(num_samples, -1)[1]
        out = out.cast(dtypes.int64)
        return out if self.ndim == 2 else out.reshape(num_samples)
