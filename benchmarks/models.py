"""Whole models, lazygrad against torch eager running the same model in the same run (CPU unless DEV says otherwise):
MiniLM sentence embeddings (examples/minilm.py), GPT-2 124M decoding with a KV cache (examples/gpt2.py), and a
ResNet-18 training step (examples/resnet.py).

For each model:
- first result: seconds from the model's weights being loaded to the first output, which for lazygrad includes
  scheduling, code generation and compiling every kernel (the compiler's disk cache points at an empty folder);
- steady state: median seconds per step (a batch of sentences, a generated token, a training step) once warm, for
  lazygrad under its JIT;
- kernels: the kernels one steady step launches (lazygrad; torch eager launches one or more per op).

    python benchmarks/models.py                  # all three, CPU-sized inputs
    python benchmarks/models.py --models gpt2 --tokens 64
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# before lazygrad is imported: compiled kernels from earlier runs must not hide the compile time of the first result
os.environ.setdefault("CACHEDIR", tempfile.mkdtemp(prefix="lazygrad-bench-"))

import numpy as np

from lazygrad import Tensor
from lazygrad.engine import CompiledRunner

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(name: str) -> ModuleType:
    """examples/`name`.py as a module."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def jit_kernels(jit: Any) -> int:
    """The kernels a captured TinyJit replays per call (copies aside)."""
    return sum(1 for ei in jit.jit_cache if isinstance(ei.runner, CompiledRunner))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    st = time.perf_counter()
    out = fn()
    return time.perf_counter() - st, out


def median_seconds(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        times.append(timed(fn)[0])
    return statistics.median(times)


# *** the models ***


def minilm(args: argparse.Namespace) -> dict[str, Any]:
    """A batch of sentences -> embeddings."""
    m = example("minilm")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, int(rng.integers(6, 40)))) for _ in range(args.sentences)]
    model, tok = m.load()
    reference = m.torch_reference()
    first, got = timed(lambda: m.embed(model, tok, sentences))
    want_first, want = timed(lambda: reference(sentences))
    cos = float(np.min(np.sum(got * want, axis=1)))
    assert cos > 0.9999, f"lazygrad's MiniLM embeddings differ from torch's (cosine {cos})"
    m.embed(model, tok, sentences)  # the JIT captures on the second call
    # the sentences fall into batches of a few shapes, one captured JIT each
    kernels = sum(jit_kernels(j) for j in model._jits.values())
    return {
        "model": f"MiniLM-L6 embeddings, {args.sentences} sentences",
        "unit": "batch",
        "first": (first, want_first),
        "steady": (
            median_seconds(lambda: m.embed(model, tok, sentences), args.runs),
            median_seconds(lambda: reference(sentences), args.runs),
        ),
        "kernels": kernels,
    }


def gpt2(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy decoding of `--tokens` tokens after an 8-token prompt; a step is one token."""
    g = example("gpt2")
    model = g.GPT2(g.GPT2Config.gpt2_124m(), seed=0)
    prompt = [464, 2068, 7586, 21831, 18045, 625, 262, 16931]
    times: list[float] = []
    st = time.perf_counter()
    got = g.generate(model, prompt, args.tokens, timings=times)
    first = times[0] - st
    warm = 3  # the JIT runs the first decode plainly and captures on the second
    steady = statistics.median(np.diff(times[warm:])) if len(times) > warm + 1 else float("nan")
    ttimes: list[float] = []
    st = time.perf_counter()
    want = g.torch_generate(model, prompt, args.tokens, timings=ttimes)
    assert got == want, f"lazygrad and torch generate different tokens:\n{got}\n{want}"
    return {
        "model": "GPT-2 124M decode (KV cache)",
        "unit": "token",
        "first": (first, ttimes[0] - st),
        "steady": (steady, statistics.median(np.diff(ttimes[warm:]))),
        "kernels": jit_kernels(model.decode_step),
    }


def resnet(args: argparse.Namespace) -> dict[str, Any]:
    """One SGD training step of ResNet-18 on random images."""
    import torch

    r = example("resnet")
    model = r.resnet18(num_classes=1000)
    lr = r.LR * args.batch / 256  # the example's default: the linear scaling rule
    _, torch_step = r.torch_reference(model, lr=lr)
    step = r.make_train_step(model, lr=lr)
    data = r.random_batches(args.steps, args.batch, args.size, 1000)
    losses, times = [], []
    for x, y in data:
        t, loss = timed(lambda x=x, y=y: step(Tensor(x), Tensor(y)).item())
        losses.append(loss)
        times.append(t)
    tlosses, ttimes = [], []
    for x, y in data:
        t, loss = timed(lambda x=x, y=y: torch_step(torch.from_numpy(x), torch.from_numpy(y).long()).item())
        tlosses.append(loss)
        ttimes.append(t)
    # on random labels the losses of later steps drift apart with float32 rounding alone (BatchNorm over few values
    # amplifies it), torch against torch in float64 too; the first steps are the check
    np.testing.assert_allclose(
        losses[:3], tlosses[:3], rtol=1e-3, atol=1e-3, err_msg="lazygrad's losses differ from torch's"
    )
    return {
        "model": f"ResNet-18 train step, batch {args.batch} at {args.size}x{args.size}",
        "unit": "step",
        "first": (times[0], ttimes[0]),
        "steady": (statistics.median(times[2:]), statistics.median(ttimes[2:])),
        "kernels": jit_kernels(step),
    }


MODELS = {"minilm": minilm, "gpt2": gpt2, "resnet": resnet}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--sentences", type=int, default=16, help="MiniLM: sentences per batch")
    parser.add_argument("--tokens", type=int, default=24, help="GPT-2: tokens to generate")
    parser.add_argument("--batch", type=int, default=8, help="ResNet-18: images per step")
    parser.add_argument("--size", type=int, default=64, help="ResNet-18: image height and width")
    parser.add_argument("--steps", type=int, default=6, help="ResNet-18: training steps")
    parser.add_argument("--runs", type=int, default=5, help="steady-state calls timed (MiniLM)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/models.py compares with torch eager: pip install torch")
    torch.manual_seed(0)
    rows = [MODELS[name](args) for name in args.models]
    print(f"\n{torch.get_num_threads()} torch threads; lazygrad compiles into the empty cache {os.environ['CACHEDIR']}")
    head = f"{'model':44s} {'first result lazygrad / torch':>30s} {'steady lazygrad / torch':>26s} {'torch/lg':>9s}"
    print(head + f" {'kernels':>8s}")
    for r in rows:
        (f_lg, f_t), (s_lg, s_t) = r["first"], r["steady"]
        first = f"{f_lg:9.2f} s / {f_t:7.3f} s"
        steady = f"{s_lg * 1e3:8.1f} / {s_t * 1e3:7.1f} ms/{r['unit']}"
        print(f"{r['model']:44s} {first:>30s} {steady:>26s} {s_t / s_lg:9.2f} {r['kernels']:8d}")


if __name__ == "__main__":
    main()
