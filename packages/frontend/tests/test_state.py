"""State dicts, safetensors (checked by hand and against the reference `safetensors` package) and PyTorch
checkpoints written by torch itself, read without it."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections import OrderedDict, namedtuple
from pathlib import Path

import numpy as np
import pytest

from lazygrad import Tensor, dtypes, nn
from lazygrad.nn.state import (
    SafetensorsError,
    TorchLoadError,
    _from_bytes,
    _to_bytes,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_metadata,
    safe_save,
    torch_load,
)

# *** state dicts ***


class Block:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(2, 3, 3)
        self.norms = [nn.LayerNorm(3), nn.LayerNorm(3)]
        self.heads = {"a": nn.Linear(3, 2), "b": nn.Linear(3, 1, bias=False)}
        self.scale = 2.0
        self.name = "block"


def test_state_dict_names_follow_attributes() -> None:
    sd = get_state_dict(Block())
    assert list(sd) == [
        "conv.weight",
        "conv.bias",
        "norms.0.weight",
        "norms.0.bias",
        "norms.1.weight",
        "norms.1.bias",
        "heads.a.weight",
        "heads.a.bias",
        "heads.b.weight",
    ]
    pair = namedtuple("pair", ["left", "right"])(Tensor([1.0]), Tensor([2.0]))
    assert list(get_state_dict({"p": pair}, prefix="m.")) == ["m.p.left", "m.p.right"]


def test_get_parameters_is_distinct_and_survives_cycles() -> None:
    b = Block()
    b.again = b.conv.weight  # the same tensor twice
    b.me = b  # a cycle
    params = get_parameters(b)
    assert len(params) == 9 and len({id(p) for p in params}) == 9


def test_load_state_dict_copies_casts_and_checks() -> None:
    lin = nn.Linear(3, 2)
    w = np.arange(6, dtype=np.float64).reshape(2, 3)
    load_state_dict(lin, {"weight": Tensor(w), "bias": Tensor([1.0, -1.0])})
    assert lin.weight.dtype == dtypes.float32, "values take the model's dtype"
    np.testing.assert_array_equal(lin.weight.numpy(), w)
    np.testing.assert_array_equal(lin(Tensor([[1.0, 0.0, 0.0]])).numpy(), [[1.0, 2.0]])
    with pytest.raises(KeyError, match="bias"):
        load_state_dict(lin, {"weight": Tensor(w)})
    load_state_dict(lin, {"weight": Tensor(w * 2)}, strict=False)
    np.testing.assert_array_equal(lin.bias.numpy(), [1.0, -1.0])
    with pytest.raises(ValueError, match="shape"):
        load_state_dict(lin, {"weight": Tensor(w.T), "bias": Tensor([0.0, 0.0])})
    sd = {"weight": Tensor(w), "bias": Tensor([0.0, 0.0]), "extra": Tensor([1.0])}
    load_state_dict(lin, sd, consume=True)
    assert list(sd) == ["extra"]


def test_loaded_models_do_not_share_memory() -> None:
    sd = {"weight": Tensor(np.ones((2, 3), np.float32)), "bias": Tensor([0.0, 0.0])}
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    load_state_dict(a, sd)
    load_state_dict(b, sd)
    a.weight.assign(a.weight * 5).realize()
    np.testing.assert_array_equal(b.weight.numpy(), 1)
    np.testing.assert_array_equal(sd["weight"].numpy(), 1)


# *** safetensors ***

NUMPY_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                np.int64, np.uint64, np.bool_]  # fmt: skip


def sample(npdt: type, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if npdt is np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(npdt, np.integer):
        info = np.iinfo(npdt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(npdt)
    return rng.standard_normal(shape).astype(npdt)


def test_safetensors_round_trip_every_dtype(tmp_path: Path) -> None:
    arrays = {f"t{i}": sample(dt, (3, i + 1), i) for i, dt in enumerate(NUMPY_DTYPES)}
    arrays["scalar"] = np.array(2.5, np.float32)
    arrays["empty"] = np.zeros((0, 4), np.float32)
    tensors = {k: Tensor(v) for k, v in arrays.items()}
    tensors["bf16"] = Tensor([1.0, -2.5, 3.0e10], dtype=dtypes.bfloat16)
    # fp8 has no kernels on every device yet: made from its bytes, checked by its bytes
    tensors["fp8"] = _from_bytes(bytes([0, 56, 184, 127]), dtypes.fp8e4m3, (4,), None)
    safe_save(tensors, tmp_path / "a.safetensors", metadata={"format": "pt", "step": 3})
    back = safe_load(tmp_path / "a.safetensors")
    assert list(back) == list(tensors)
    for k, v in arrays.items():
        assert back[k].dtype == tensors[k].dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(back[k].numpy(), v)
    np.testing.assert_array_equal(back["bf16"].float().numpy(), tensors["bf16"].float().numpy())
    assert back["fp8"].dtype == dtypes.fp8e4m3
    assert _to_bytes(back["fp8"]) == bytes([0, 56, 184, 127])
    assert safe_metadata(tmp_path / "a.safetensors") == {"format": "pt", "step": "3"}


def test_safetensors_layout_by_hand(tmp_path: Path) -> None:
    safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor([[7]], dtype=dtypes.int16)}, tmp_path / "x.safetensors")
    raw = (tmp_path / "x.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0, "the data starts 8-byte aligned"
    header = json.loads(raw[8 : 8 + n])
    assert header == {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I16", "shape": [1, 1], "data_offsets": [8, 10]},
    }
    data = raw[8 + n :]
    assert data == struct.pack("<2f", 1.0, 2.0) + struct.pack("<h", 7)


def test_safetensors_against_the_reference_package(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    arrays = {f"t{i}": sample(dt, (2, 3), i) for i, dt in enumerate(NUMPY_DTYPES)}
    safe_save({k: Tensor(v) for k, v in arrays.items()}, tmp_path / "ours.safetensors")
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    for k, v in arrays.items():
        assert theirs[k].dtype == v.dtype
        np.testing.assert_array_equal(theirs[k], v)
    st.save_file(arrays, str(tmp_path / "theirs.safetensors"), metadata={"who": "reference"})
    ours = safe_load(tmp_path / "theirs.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(ours[k].numpy(), v)
    assert safe_metadata(tmp_path / "theirs.safetensors") == {"who": "reference"}


def test_safetensors_bfloat16_from_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    t = torch.randn(4, 5).to(torch.bfloat16)
    st.save_file({"w": t, "h": t.half()}, str(tmp_path / "bf.safetensors"))
    ours = safe_load(tmp_path / "bf.safetensors")
    assert ours["w"].dtype == dtypes.bfloat16 and ours["h"].dtype == dtypes.float16
    np.testing.assert_array_equal(ours["w"].float().numpy(), t.float().numpy())
    safe_save({"w": ours["w"]}, tmp_path / "back.safetensors")
    assert torch.equal(st.load_file(str(tmp_path / "back.safetensors"))["w"], t)


def test_safetensors_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x00")
    with pytest.raises(SafetensorsError, match="too short"):
        safe_load(bad)
    bad.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(SafetensorsError, match="past the end"):
        safe_load(bad)
    head = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(head)) + head + b"\x00" * 8)
    with pytest.raises(SafetensorsError, match="don't fit"):
        safe_load(bad)
    head = json.dumps({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(head)) + head + b"\x00" * 8)
    with pytest.raises(SafetensorsError, match="C64"):
        safe_load(bad)


def test_model_round_trip_through_safetensors(tmp_path: Path) -> None:
    a, b = Block(), Block()
    safe_save(get_state_dict(a), tmp_path / "m.safetensors")
    load_state_dict(b, safe_load(tmp_path / "m.safetensors"))
    x = Tensor(np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32))
    np.testing.assert_array_equal(b.conv(x).numpy(), a.conv(x).numpy())


# *** PyTorch checkpoints ***


def torch_state() -> tuple[dict, dict]:
    """A checkpoint with every storage type, views, shared storage, parameters and nesting, and its numpy values."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    sd = OrderedDict(
        [
            ("f32", base),
            ("f64", torch.randn(3, generator=g, dtype=torch.float64)),
            ("f16", torch.randn(2, 2, generator=g).half()),
            ("bf16", torch.randn(5, generator=g).to(torch.bfloat16)),
            ("i64", torch.arange(-3, 3)),
            ("i32", torch.arange(4, dtype=torch.int32)),
            ("i16", torch.tensor([-7, 8], dtype=torch.int16)),
            ("i8", torch.tensor([-128, 127], dtype=torch.int8)),
            ("u8", torch.tensor([0, 255], dtype=torch.uint8)),
            ("bool", torch.tensor([True, False, True])),
            ("scalar", torch.tensor(3.5)),
            ("transposed", base.t()),
            ("strided", base[1:, ::2]),
            ("param", torch.nn.Parameter(torch.ones(2))),
            ("nested", {"list": [torch.zeros(2, dtype=torch.int32), 7], "name": "x", "lr": 0.5}),
        ]
    )
    ref = {k: (v.float() if v.dtype == torch.bfloat16 else v).detach().numpy() for k, v in sd.items() if k != "nested"}
    return sd, ref


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_load(tmp_path: Path, zip_format: bool) -> None:
    torch = pytest.importorskip("torch")
    sd, ref = torch_state()
    fn = tmp_path / "ckpt.pth"
    torch.save(sd, fn, _use_new_zipfile_serialization=zip_format)
    out = torch_load(fn)
    assert isinstance(out, OrderedDict) and list(out) == list(sd)
    for k, v in ref.items():
        got = out[k].float().numpy() if k == "bf16" else out[k].numpy()
        assert got.dtype == v.dtype, k
        np.testing.assert_array_equal(got, v, err_msg=k)
    assert out["nested"]["name"] == "x" and out["nested"]["list"][1] == 7 and out["nested"]["lr"] == 0.5
    np.testing.assert_array_equal(out["nested"]["list"][0].numpy(), [0, 0])


def test_torch_module_state_dict_loads_into_our_layers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4))
    module[1].running_mean.uniform_()
    torch.save(module.state_dict(), tmp_path / "m.pt")
    ours = [nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4)]
    load_state_dict(ours, torch_load(tmp_path / "m.pt"))
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    got = ours[1](ours[0](Tensor(x)))
    np.testing.assert_allclose(got.numpy(), module.eval()(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_torch_load_refuses_arbitrary_objects(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(TorchLoadError, match="state_dict"):
        torch_load(tmp_path / "module.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(TorchLoadError, match="not a PyTorch checkpoint"):
        torch_load(tmp_path / "junk.pt")


def test_torch_load_runs_without_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.arange(6.0).reshape(2, 3).t()}, tmp_path / "w.pt")
    script = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "from lazygrad.nn.state import torch_load\n"
        f"print(torch_load({str(tmp_path / 'w.pt')!r})['w'].numpy().tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]"
