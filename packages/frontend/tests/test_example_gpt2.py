"""examples/gpt2.py: a small random GPT-2 against the same math written independently in torch (full sequences,
no cache), KV-cache generation under TinyJit with a symbolic position against full recomputation, one compile for
every position, and loading weights in GPT-2's safetensors layout."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from lazygrad import Context, Tensor, dtypes

PROMPT = [3, 97, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32]  # 16 tokens


@pytest.fixture(scope="module")
def gpt2(load_example) -> ModuleType:
    return load_example("gpt2")


@pytest.fixture(scope="module")
def weights(gpt2: ModuleType) -> dict[str, np.ndarray]:
    """GPT-2's init for the small config with the matrices scaled up 10x: peaked logits that change from token to
    token, so greedy decoding doesn't settle on one token and a wrong cache entry shows."""
    w = gpt2.random_weights(gpt2.GPT2Config.small(), seed=3)
    return {k: v * np.float32(10) if v.ndim == 2 else v for k, v in w.items()}


def _tokens(xs: list[int]) -> Tensor:
    return Tensor([xs], dtype=dtypes.int32)


def test_logits_match_torch(gpt2: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = gpt2.GPT2(gpt2.GPT2Config.small(), seed=1)
    out = model(_tokens(PROMPT), 0).numpy()
    assert out.shape == (1, 16, 100)
    np.testing.assert_allclose(out[0], gpt2.torch_reference(model)(PROMPT), rtol=1e-4, atol=1e-4)


def test_a_prompt_in_two_chunks_matches_it_whole(gpt2: ModuleType) -> None:
    """The second chunk attends to the first through the cache, with a causal mask offset by its start."""
    pytest.importorskip("torch")
    model = gpt2.GPT2(gpt2.GPT2Config.small(), seed=2)
    model(_tokens(PROMPT[:5]), 0).realize()
    out = model(_tokens(PROMPT[5:]), 5).numpy()[0]
    np.testing.assert_allclose(out, gpt2.torch_reference(model)(PROMPT)[5:], rtol=1e-4, atol=1e-4)


def test_kv_cache_decoding_matches_full_recomputation(gpt2: ModuleType, weights: dict[str, np.ndarray]) -> None:
    pytest.importorskip("torch")
    model = gpt2.GPT2(gpt2.GPT2Config.small(), weights=weights)
    full = gpt2.torch_reference(model)
    prompt, count = PROMPT[:5], 12
    tokens = list(prompt)
    logits = model.forward(_tokens(prompt), 0, last_only=True).numpy()[0, -1]
    for step in range(count):
        np.testing.assert_allclose(logits, full(tokens)[-1], rtol=1e-4, atol=1e-3, err_msg=f"step {step}")
        tokens.append(int(np.argmax(logits)))
        logits = model.decode(tokens[-1], len(tokens) - 1).numpy()[0, -1]
    assert model.decode_step.cnt == count and len(model.decode_step.jit_cache) > 0
    assert len(set(tokens[len(prompt) :])) > 2, "greedy decoding of these weights should not repeat one token"
    # generate() makes the same tokens (a fresh prefill overwrites the cache entries it reads)
    assert gpt2.generate(model, prompt, count) == tokens[len(prompt) :]


def test_decode_step_compiles_once_for_every_position(
    gpt2: ModuleType, weights: dict[str, np.ndarray], compiles: list[object]
) -> None:
    model = gpt2.GPT2(gpt2.GPT2Config.small(), weights=weights)
    prompt = PROMPT[:4]
    model(_tokens(prompt), 0).realize()
    # without the JIT the decode step runs its graph each time: a new position must reuse the compiled kernels
    with Context(JIT=0):
        model.decode(7, 4)
        before = len(compiles)
        for pos in (5, 6, 30, 63):
            model.decode(pos % 100, pos)
    assert len(compiles) == before, "a new position compiled a new kernel"
    # with it: the first call runs, the second captures, the others replay the one capture
    for pos in (5, 6, 7, 8, 9):
        model.decode(pos, pos)
    assert len(compiles) == before and model.decode_step.cnt == 5


def test_generate_samples_with_a_seed(gpt2: ModuleType, weights: dict[str, np.ndarray]) -> None:
    model = gpt2.GPT2(gpt2.GPT2Config.small(), weights=weights)
    a = gpt2.generate(model, PROMPT[:3], 8, temperature=1.0, seed=4)
    assert a == gpt2.generate(model, PROMPT[:3], 8, temperature=1.0, seed=4)
    assert len(a) == 8 and all(0 <= t < 100 for t in a)
    # a temperature near 0 is greedy decoding
    assert gpt2.generate(model, PROMPT[:3], 8, temperature=1e-6) == gpt2.generate(model, PROMPT[:3], 8)


def test_safetensors_round_trip(gpt2: ModuleType, weights: dict[str, np.ndarray], tmp_path: Path) -> None:
    save_file = pytest.importorskip("safetensors.numpy").save_file
    # the published layout: a "transformer." prefix and attention-mask buffers that the model ignores
    tensors = {f"transformer.{k}": np.ascontiguousarray(v) for k, v in weights.items()}
    tensors["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"n_head": 4, "n_layer": 2}')  # the head count isn't in the weights
    loaded = gpt2.GPT2.from_safetensors(tmp_path / "model.safetensors")
    assert loaded.config == gpt2.GPT2Config.small()
    assert gpt2.GPT2.from_safetensors(tmp_path / "model.safetensors", n_head=2).config.n_head == 2
    for k, v in loaded.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), weights[k], err_msg=k)
    expected = gpt2.GPT2(gpt2.GPT2Config.small(), weights=weights)(_tokens(PROMPT[:6])).numpy()
    np.testing.assert_allclose(loaded(_tokens(PROMPT[:6])).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_bad_weights_and_positions_raise(gpt2: ModuleType, weights: dict[str, np.ndarray]) -> None:
    config = gpt2.GPT2Config.small()
    with pytest.raises(ValueError, match=r"wpe\.weight has shape"):
        gpt2.GPT2(config, weights={**weights, "wpe.weight": np.zeros((32, 64), np.float32)})
    with pytest.raises(KeyError, match=r"ln_f\.bias"):
        gpt2.GPT2(config, weights={k: v for k, v in weights.items() if k != "ln_f.bias"})
    model = gpt2.GPT2(config, weights=weights)
    with pytest.raises(ValueError, match="the model has 64"):
        gpt2.generate(model, PROMPT, 50)
    with pytest.raises(ValueError, match="integers"):
        model(Tensor([[1.0, 2.0]]))


def test_main_runs_a_small_random_model(gpt2: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    gpt2.main(["--layers", "1", "--width", "64", "--count", "4", "--prompt-tokens", "1,2,3"])
    out = capsys.readouterr().out
    assert "generated [" in out and "tokens/s" in out
