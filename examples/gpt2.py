"""GPT-2 in lazygrad: the 124M architecture (or a smaller one) with random or real weights, generating with a KV
cache under TinyJit.

The decode step takes one token at position `start_pos`, bound as `Variable("start_pos", 1, n_ctx - 1).bind(pos)`,
the token itself bound as `Variable("token", 0, vocab - 1)` (its embedding is a one-row window of wte at that
offset): each layer writes the token's key and value into its preallocated cache (an assign into a shrink of a
realized buffer at a symbolic offset) and attends over the first `start_pos + 1` cache entries (a symbolic length),
so one jitted function with one set of compiled kernels serves every token at every position. The prompt runs
once, un-jitted (a symbolic start_pos takes one token at a time).

Run:  python examples/gpt2.py                                   (random 124M weights, a fixed prompt)
      python examples/gpt2.py --layers 2 --width 128             (a small random model)
      python examples/gpt2.py --model gpt2/model.safetensors --prompt "Hello, I'm a language model,"
A text prompt needs the `tokenizers` package and GPT-2's tokenizer.json beside the model file (or --tokenizer);
otherwise pass token ids with --prompt-tokens 15496,11,314.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lazygrad import Tensor, TinyJit, Variable, dtypes
from lazygrad.nn.state import safe_load
from lazygrad_uop.shape import resolve
from lazygrad_uop.uop import UOp

# *** the model ***


@dataclass(frozen=True)
class GPT2Config:
    """The sizes of a GPT-2 model; the defaults are GPT-2 small (124M parameters)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_ctx: int = 1024
    vocab_size: int = 50257
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must divide by n_head {self.n_head}")
        if self.n_ctx < 2:
            raise ValueError(f"n_ctx must be at least 2 to generate, got {self.n_ctx}")

    @classmethod
    def gpt2_124m(cls) -> GPT2Config:
        """GPT-2 small: 12 layers, 12 heads, 768 wide, 1024 positions, 50257 tokens."""
        return cls()

    @classmethod
    def small(
        cls, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_ctx: int = 64, vocab_size: int = 100
    ) -> GPT2Config:
        """A small model for tests and quick runs (by default 2 layers, 4 heads, 64 wide, 64 positions, 100 tokens)."""
        return cls(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_ctx=n_ctx, vocab_size=vocab_size)


def weight_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every weight of the model by its name in GPT-2 checkpoints, with its shape (Conv1D weights are (in, out))."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (c.vocab_size, c.n_embd), "wpe.weight": (c.n_ctx, c.n_embd)}
    for i in range(c.n_layer):
        for name, fan_in, fan_out in (
            ("ln_1", 0, c.n_embd),
            ("attn.c_attn", c.n_embd, 3 * c.n_embd),
            ("attn.c_proj", c.n_embd, c.n_embd),
            ("ln_2", 0, c.n_embd),
            ("mlp.c_fc", c.n_embd, 4 * c.n_embd),
            ("mlp.c_proj", 4 * c.n_embd, c.n_embd),
        ):
            shapes[f"h.{i}.{name}.weight"] = (fan_out,) if name.startswith("ln") else (fan_in, fan_out)
            shapes[f"h.{i}.{name}.bias"] = (fan_out,)
    shapes["ln_f.weight"] = shapes["ln_f.bias"] = (c.n_embd,)
    return shapes


def random_weights(config: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: matrices and embeddings normal with std 0.02 (the residual projections, c_proj, scaled
    by 1/sqrt(2 n_layer) as in the GPT-2 paper), biases 0, LayerNorm gains 1. Drawn with numpy, so a seed gives the
    same model on every device."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if name.endswith(".bias"):
            out[name] = np.zeros(shape, np.float32)
        elif len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("c_proj.weight") else 0.02
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    return out


class Conv1D:
    """GPT-2's dense layer: x @ weight + bias, weight stored (in, out) as in the published checkpoints."""

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class LayerNorm:
    """Normalise the last axis, then scale by `weight` and shift by `bias`."""

    def __init__(self, weight: Tensor, bias: Tensor, eps: float) -> None:
        self.weight, self.bias, self.eps = weight, bias, eps

    def __call__(self, x: Tensor) -> Tensor:
        return x.layernorm(eps=self.eps) * self.weight + self.bias


class Attention:
    """Causal multi-head self-attention over a KV cache of `n_ctx` positions (that GPT2 allocates)."""

    def __init__(self, config: GPT2Config, c_attn: Conv1D, c_proj: Conv1D) -> None:
        self.n_head, self.c_attn, self.c_proj = config.n_head, c_attn, c_proj
        self.cache_kv: Tensor | None = None  # (2, batch, n_ctx, n_head, head_dim): keys, values

    def __call__(self, x: Tensor, start_pos: int | UOp) -> Tensor:
        assert self.cache_kv is not None, "GPT2 allocates the cache before calling its blocks"
        batch, seqlen, width = x.shape
        q, k, v = (t.reshape(batch, seqlen, self.n_head, -1) for t in self.c_attn(x).split(width, dim=2))
        end = start_pos + seqlen
        # write this call's keys and values into their place in the cache, then read the cache up to them
        self.cache_kv.shrink((None, None, (start_pos, end), None, None)).assign(k.stack(v)).realize()
        keys, values = (self.cache_kv[i].shrink((None, (0, end), None, None)) for i in (0, 1))
        mask = None
        if seqlen > 1:
            # query i sits at position start_pos + i and sees cache entries 0 .. start_pos + i
            mask = Tensor.full((1, 1, seqlen, end), -math.inf).triu(resolve(start_pos) + 1)
        q, keys, values = (t.transpose(1, 2) for t in (q, keys, values))
        scores = q @ keys.transpose(2, 3) * (1 / math.sqrt(q.shape[-1]))
        weights = (scores if mask is None else scores + mask).softmax(-1)
        out = weights @ values
        return self.c_proj(out.transpose(1, 2).reshape(batch, seqlen, width))


class Block:
    """A pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)) with a tanh-approximated GELU."""

    def __init__(self, config: GPT2Config, w: dict[str, Tensor], prefix: str) -> None:
        def conv(name: str) -> Conv1D:
            return Conv1D(w[f"{prefix}.{name}.weight"], w[f"{prefix}.{name}.bias"])

        def norm(name: str) -> LayerNorm:
            return LayerNorm(w[f"{prefix}.{name}.weight"], w[f"{prefix}.{name}.bias"], config.layer_norm_eps)

        self.ln_1, self.ln_2 = norm("ln_1"), norm("ln_2")
        self.attn = Attention(config, conv("attn.c_attn"), conv("attn.c_proj"))
        self.mlp_c_fc, self.mlp_c_proj = conv("mlp.c_fc"), conv("mlp.c_proj")

    def __call__(self, x: Tensor, start_pos: int | UOp) -> Tensor:
        h = x + self.attn(self.ln_1(x), start_pos)
        act = self.mlp_c_fc(self.ln_2(h)).gelu(approximate="tanh")
        return h + self.mlp_c_proj(act)


class GPT2:
    """GPT-2: token and position embeddings, `n_layer` blocks, a final LayerNorm and an LM head tied to the token
    embedding.

    `model(tokens, start_pos)` gives the logits (batch, seqlen, vocab) of tokens (batch, seqlen) at positions
    start_pos, start_pos + 1, ... and keeps their keys and values in the cache, where later calls (at later
    positions) attend to them. `weights` (name -> array, GPT-2 checkpoint names) replaces the random ones."""

    def __init__(
        self, config: GPT2Config, seed: int = 0, weights: dict[str, np.ndarray | Tensor] | None = None
    ) -> None:
        self.config = config
        src = random_weights(config, seed) if weights is None else weights
        shapes = weight_shapes(config)
        if missing := [k for k in shapes if k not in src]:
            raise KeyError(f"GPT-2 weights {missing[:4]}{'...' if len(missing) > 4 else ''} are missing")
        w: dict[str, Tensor] = {}
        for name, shape in shapes.items():
            t = src[name] if isinstance(src[name], Tensor) else Tensor(np.asarray(src[name]))
            if t.shape != shape:
                raise ValueError(f"GPT-2 weight {name} has shape {t.shape}, a {config} model needs {shape}")
            w[name] = t.float()
        Tensor.realize(*w.values())
        self._weights = w
        self.wte, self.wpe = w["wte.weight"], w["wpe.weight"]
        self.h = [Block(config, w, f"h.{i}") for i in range(config.n_layer)]
        self.ln_f = LayerNorm(w["ln_f.weight"], w["ln_f.bias"], config.layer_norm_eps)
        self.start_pos = Variable("start_pos", 1, config.n_ctx - 1)
        self.token = Variable("token", 0, config.vocab_size - 1)
        # one capture serves every token at every position: both are bound variables, the caches the same buffers
        self.decode_step = TinyJit(self._decode)

    def state_dict(self) -> dict[str, Tensor]:
        """The weights by their GPT-2 checkpoint names (Conv1D weights (in, out)); not the KV caches."""
        return dict(self._weights)

    @classmethod
    def from_safetensors(cls, path: str | Path, n_head: int | None = None) -> GPT2:
        """A model with the weights of a GPT-2 safetensors file (the published layout: wte, wpe, h.N.ln_1,
        h.N.attn.c_attn, ..., ln_f; names may start with `transformer.`; other tensors such as the attention-mask
        buffers `h.N.attn.bias` are ignored). The sizes come from the weights' shapes; the head count, which they
        don't show, from `n_head`, else a config.json beside the file, else 64-wide heads as in every published
        GPT-2."""
        tensors = {k.removeprefix("transformer."): v for k, v in safe_load(path).items()}
        if missing := [k for k in ("wte.weight", "wpe.weight", "ln_f.weight") if k not in tensors]:
            raise KeyError(f"{path} has no {missing}: is it a GPT-2 checkpoint (wte, wpe, h.N..., ln_f)?")
        vocab, width = tensors["wte.weight"].shape
        n_layer = 0
        while f"h.{n_layer}.ln_1.weight" in tensors:
            n_layer += 1
        if n_head is None and (cfg := Path(path).with_name("config.json")).exists():
            n_head = json.loads(cfg.read_text()).get("n_head")
        if n_head is None:
            n_head = max(1, width // 64)
        n_ctx = tensors["wpe.weight"].shape[0]
        config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=width, n_ctx=n_ctx, vocab_size=vocab)
        return cls(config, weights=tensors)

    def __call__(self, tokens: Tensor, start_pos: int | UOp = 0) -> Tensor:
        return self.forward(tokens, start_pos)

    def forward(self, tokens: Tensor, start_pos: int | UOp = 0, last_only: bool = False) -> Tensor:
        """Logits (batch, seqlen, vocab) of integer tokens (batch, seqlen) at positions start_pos.. (an int, or a
        bound Variable for one token); last_only: only the last position's logits (batch, 1, vocab)."""
        if tokens.ndim != 2 or dtypes.is_float(tokens.dtype):
            raise ValueError(f"tokens must be integers of shape (batch, seqlen), got {tokens.dtype!r} {tokens.shape}")
        return self._layers(tokens.embedding(self.wte), start_pos, last_only)

    def decode(self, token: int, start_pos: int) -> Tensor:
        """The logits (1, 1, vocab) of one token at position start_pos >= 1 after the tokens before it went through
        the model (batch 1): one replay of the jitted decode step."""
        return self.decode_step(self.token.bind(token), self.start_pos.bind(start_pos))

    def _decode(self, token: UOp, start_pos: UOp) -> Tensor:
        # the token's embedding is a one-row window of wte at a symbolic offset: a read of one row, no lookup
        x = self.wte.shrink(((token, token + 1), None)).reshape(1, 1, self.config.n_embd)
        return self._layers(x, start_pos, last_only=True).realize()

    def _layers(self, x: Tensor, start_pos: int | UOp, last_only: bool) -> Tensor:
        """Embeddings (batch, seqlen, n_embd) at positions start_pos.. -> logits, through the blocks and the cache."""
        batch, seqlen, _ = x.shape
        first = resolve(start_pos)
        if first < 0 or first + seqlen > self.config.n_ctx:
            raise ValueError(
                f"positions {first}..{first + seqlen - 1} don't fit the model's {self.config.n_ctx} positions"
            )
        if not isinstance(start_pos, int) and seqlen != 1:
            # the causal mask of several queries would need a triangle at a symbolic offset
            raise NotImplementedError("a symbolic start_pos takes one token at a time; pass an int for more")
        self._ensure_cache(batch)
        x = x + self.wpe.shrink(((start_pos, start_pos + seqlen), None))
        for block in self.h:
            x = block(x, start_pos)
        if last_only:
            x = x[:, -1:]
        return self.ln_f(x) @ self.wte.T

    def _ensure_cache(self, batch: int) -> None:
        cache = self.h[0].attn.cache_kv if self.h else None
        if cache is not None and cache.shape[1] == batch:
            return
        c = self.config
        for block in self.h:
            # zeros, realized: every later call writes into this one buffer
            shape = (2, batch, c.n_ctx, c.n_head, c.n_embd // c.n_head)
            block.attn.cache_kv = Tensor.zeros(*shape).contiguous().realize()
        self.decode_step.reset()  # a capture holds the old caches' buffers


# *** generation ***


def _sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def generate(
    model: GPT2,
    prompt: list[int],
    count: int,
    temperature: float = 0.0,
    seed: int = 0,
    timings: list[float] | None = None,
) -> list[int]:
    """`count` tokens following `prompt`: greedy (temperature 0) or sampled from softmax(logits / temperature) with
    a numpy generator seeded with `seed`. The prompt runs once without the JIT; each later token is one call of the
    model's jitted decode step. timings: if given, gets time.perf_counter() after each token."""
    if not prompt:
        raise ValueError("generate needs a prompt of at least one token")
    if count < 1:
        return []
    if len(prompt) + count - 1 > model.config.n_ctx:
        raise ValueError(
            f"a prompt of {len(prompt)} tokens and {count} new ones need {len(prompt) + count - 1} positions, "
            f"the model has {model.config.n_ctx}"
        )
    rng = np.random.default_rng(seed)
    logits = model.forward(Tensor([prompt], dtype=dtypes.int32), 0, last_only=True)
    out: list[int] = []
    for i in range(count):
        out.append(_sample(logits.numpy()[0, -1], temperature, rng))
        if timings is not None:
            timings.append(time.perf_counter())
        if i == count - 1:
            break
        logits = model.decode(out[-1], len(prompt) + i)
    return out


# *** an independent reference in torch ***


def _torch_forward(config: GPT2Config, w: dict, tokens: list[int], cache: list, start_pos: int) -> Any:
    """GPT-2 in torch over `cache` (per layer, preallocated (n_head, n_ctx, head_dim) keys and values): the
    logits (seqlen, vocab) of `tokens` at positions start_pos.."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own spelling

    c, n = config, len(tokens)
    hd = c.n_embd // c.n_head
    end = start_pos + n
    dev = w["wte.weight"].device
    x = w["wte.weight"][torch.tensor(tokens, device=dev)] + w["wpe.weight"][start_pos:end]
    # key j is visible to query i (at position start_pos + i) when j <= start_pos + i
    visible = torch.arange(end, device=dev)[None, :] <= (torch.arange(n, device=dev) + start_pos)[:, None]
    for i, (kc, vc) in enumerate(cache):
        p = f"h.{i}."
        h = F.layer_norm(x, (c.n_embd,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], c.layer_norm_eps)
        q, k, v = torch.addmm(w[p + "attn.c_attn.bias"], h, w[p + "attn.c_attn.weight"]).split(c.n_embd, dim=1)
        q, k, v = (t.view(n, c.n_head, hd).transpose(0, 1) for t in (q, k, v))
        kc[:, start_pos:end], vc[:, start_pos:end] = k, v
        att = (q @ kc[:, :end].transpose(1, 2)) / math.sqrt(hd)
        att = torch.softmax(att.masked_fill(~visible, float("-inf")), dim=-1)
        y = (att @ vc[:, :end]).transpose(0, 1).reshape(n, c.n_embd)
        x = x + torch.addmm(w[p + "attn.c_proj.bias"], y, w[p + "attn.c_proj.weight"])
        h = F.layer_norm(x, (c.n_embd,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], c.layer_norm_eps)
        h = F.gelu(torch.addmm(w[p + "mlp.c_fc.bias"], h, w[p + "mlp.c_fc.weight"]), approximate="tanh")
        x = x + torch.addmm(w[p + "mlp.c_proj.bias"], h, w[p + "mlp.c_proj.weight"])
    x = F.layer_norm(x, (c.n_embd,), w["ln_f.weight"], w["ln_f.bias"], c.layer_norm_eps)
    return x @ w["wte.weight"].T


def _torch_state(model: GPT2, device: str = "cpu") -> tuple[dict, Callable[[], list]]:
    """The model's weights as torch tensors on torch's `device`, and a function that makes an empty KV cache."""
    import torch

    w = {k: torch.from_numpy(v.numpy().copy()).to(device) for k, v in model.state_dict().items()}
    c = model.config

    def new_cache() -> list:
        shape = (c.n_head, c.n_ctx, c.n_embd // c.n_head)
        return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in range(c.n_layer)]

    return w, new_cache


def torch_reference(model: GPT2) -> Callable[[list[int]], np.ndarray]:
    """The model's math written independently in torch with its weights copied: tokens -> logits (seqlen, vocab)
    of the whole sequence, computed without a cache from earlier calls."""
    import torch

    w, new_cache = _torch_state(model)

    def run(tokens: list[int]) -> np.ndarray:
        with torch.no_grad():
            return _torch_forward(model.config, w, list(tokens), new_cache(), 0).numpy()

    return run


def torch_generate(
    model: GPT2, prompt: list[int], count: int, timings: list[float] | None = None, device: str = "cpu"
) -> list[int]:
    """Greedy generation in torch (eager, with a KV cache, on torch's `device`) with the model's weights: the
    reference for decode speed. timings: as in `generate` (each token's argmax read back to the host first)."""
    import torch

    w, new_cache = _torch_state(model, device)
    cache, out = new_cache(), []
    with torch.no_grad():
        logits = _torch_forward(model.config, w, list(prompt), cache, 0)
        for i in range(count):
            out.append(int(logits[-1].argmax()))
            if timings is not None:
                timings.append(time.perf_counter())
            if i < count - 1:
                logits = _torch_forward(model.config, w, [out[-1]], cache, len(prompt) + i)
    return out


# *** command line ***


def _tokenizer(model_path: str, tokenizer_path: str | None) -> Any:
    """GPT-2's tokenizer from a tokenizer.json (the `tokenizers` package), or None with the reason printed."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("text prompts need the `tokenizers` package; pass --prompt-tokens instead")
        return None
    path = Path(tokenizer_path) if tokenizer_path else Path(model_path).with_name("tokenizer.json")
    if not path.exists():
        print(f"no tokenizer.json at {path}; pass --tokenizer, or --prompt-tokens instead")
        return None
    return Tokenizer.from_file(str(path))


def _rates(timings: list[float], skip: int) -> tuple[float, float]:
    """Tokens/s over all generated tokens after the first, and over those after `skip` more (the JIT's warm-up)."""
    all_rate = (len(timings) - 1) / (timings[-1] - timings[0]) if len(timings) > 1 else float("nan")
    tail = timings[skip:]
    steady = (len(tail) - 1) / (tail[-1] - tail[0]) if len(tail) > 1 else float("nan")
    return all_rate, steady


def main(argv: list[str] | None = None) -> None:
    """Generate from a random or a real GPT-2 and print the tokens and tokens/s."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GPT-2 .safetensors file (default: random weights)")
    parser.add_argument("--prompt", help="prompt text (needs --model, `tokenizers` and a tokenizer.json)")
    parser.add_argument("--tokenizer", help="GPT-2's tokenizer.json (default: beside --model)")
    parser.add_argument("--prompt-tokens", default="464,2068,7586,21831", help="comma-separated prompt token ids")
    parser.add_argument("--count", type=int, default=32, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random weights and the sampling")
    parser.add_argument("--layers", type=int, default=12, help="random model: number of blocks")
    parser.add_argument("--width", type=int, default=768, help="random model: n_embd (heads are 64 wide)")
    parser.add_argument("--torch", action="store_true", help="also time greedy decoding in torch (eager, KV cache)")
    parser.add_argument("--torch-threads", type=int, help="torch's thread count for --torch (default: torch's own)")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    if args.model:
        model = GPT2.from_safetensors(args.model)
    else:
        heads = max(1, args.width // 64)
        config = replace(GPT2Config.gpt2_124m(), n_layer=args.layers, n_embd=args.width, n_head=heads)
        model = GPT2(config, seed=args.seed)
    print(f"{model.config} ready in {time.perf_counter() - t0:.1f} s")

    tokenizer = _tokenizer(args.model, args.tokenizer) if args.prompt and args.model else None
    if args.prompt and tokenizer is None:
        print("using --prompt-tokens" + ("" if args.model else ": a text prompt needs a real model (--model)"))
    prompt = tokenizer.encode(args.prompt).ids if tokenizer else [int(t) for t in args.prompt_tokens.split(",")]
    if bad := [t for t in prompt if not 0 <= t < model.config.vocab_size]:
        parser.error(f"prompt tokens {bad} are outside the vocabulary of {model.config.vocab_size}")

    timings: list[float] = []
    start = time.perf_counter()
    out = generate(model, prompt, args.count, args.temperature, args.seed, timings)
    print(f"prompt {prompt}\ngenerated {out}")
    if tokenizer:
        print(repr(tokenizer.decode(prompt + out)))
    all_rate, steady = _rates(timings, 3)
    print(
        f"prefill + first token {timings[0] - start:.2f} s; decode {all_rate:.2f} tokens/s "
        f"({steady:.2f} tokens/s after the JIT's capture)"
    )
    if args.torch:
        import torch

        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        timings = []
        ref = torch_generate(model, prompt, args.count, timings)

        print(
            f"torch eager ({torch.get_num_threads()} threads): decode {_rates(timings, 3)[1]:.2f} tokens/s; "
            f"the same tokens: {ref == out}"
        )


if __name__ == "__main__":
    main()
