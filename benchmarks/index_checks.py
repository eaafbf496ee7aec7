"""The cost of the device-side index checks (`lazygrad.index_checks`): a jitted training step of an embedding
language model (token embedding -> MLP -> logits -> sparse categorical cross-entropy, backward, SGD), and a jitted
lookup alone (an embedding and a gather, no other work), each captured once with INDEX_CHECKS=1 and once with
INDEX_CHECKS=0 and timed alternately in the same run. The reference is the same step without checks.

Run:  python benchmarks/index_checks.py [--vocab 2000] [--batch 16] [--seq 64] [--runs 40]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from lazygrad import Context, Tensor, TinyJit, nn
from lazygrad.nn.optim import SGD
from lazygrad.nn.state import get_parameters


class TinyLM:
    """An embedding, a two-layer MLP and a projection back to the vocabulary."""

    def __init__(self, vocab: int, dim: int) -> None:
        self.emb, self.l1, self.l2 = nn.Embedding(vocab, dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, vocab)

    def __call__(self, tokens: Tensor) -> Tensor:
        return self.l2(self.l1(self.emb(tokens)).gelu())


def make_step(vocab: int, dim: int, checks: int) -> Callable[[Tensor, Tensor], Tensor]:
    """A jitted training step, captured under INDEX_CHECKS=`checks`."""
    Tensor.manual_seed(0)
    model = TinyLM(vocab, dim)
    opt = SGD(get_parameters(model), lr=0.01)

    @TinyJit
    def step(tokens: Tensor, labels: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(tokens).sparse_categorical_crossentropy(labels)
            loss.backward()
            opt.step()
            return loss.realize()

    return lambda tokens, labels: _with_checks(checks, step, tokens, labels)


def make_lookup(vocab: int, dim: int, checks: int) -> Callable[[Tensor, Tensor], Tensor]:
    """A jitted lookup only: embedding rows gathered by the tokens, and the labels' logits picked by gather."""
    Tensor.manual_seed(0)
    emb, table = nn.Embedding(vocab, dim), Tensor.randn(vocab, vocab).realize()

    @TinyJit
    def lookup(tokens: Tensor, labels: Tensor) -> Tensor:
        rows = table[tokens.flatten()]
        return (emb(tokens).sum(-1).flatten() + rows.gather(1, labels.reshape(-1, 1)).flatten()).realize()

    return lambda tokens, labels: _with_checks(checks, lookup, tokens, labels)


def _with_checks(checks: int, fn: Callable[[Tensor, Tensor], Tensor], *args: Tensor) -> Tensor:
    with Context(INDEX_CHECKS=checks):
        return fn(*args)


def alternate(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median seconds of each function, timed in turn (one call of each per round) so that load affects all alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            st = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - st)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tokens = Tensor(rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32)).realize()
    labels = Tensor(rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32)).realize()
    print(f"vocab {args.vocab}, dim {args.dim}, {args.batch}x{args.seq} tokens (CPU), median per call:\n")
    print(f"| {'workload':22s} | {'checks off (ms)':>15s} | {'checks on (ms)':>14s} | {'cost':>7s} |")
    print(f"|{'-' * 24}|{'-' * 16}:|{'-' * 15}:|{'-' * 8}:|")
    for name, make in (("training step", make_step), ("lookup only", make_lookup)):
        off, on = make(args.vocab, args.dim, 0), make(args.vocab, args.dim, 1)
        for fn in (off, on):
            for _ in range(3):  # run, capture, first replay
                fn(tokens, labels).numpy()
        t = alternate({"off": lambda f=off: f(tokens, labels), "on": lambda f=on: f(tokens, labels)}, args.runs)
        cost = (t["on"] / t["off"] - 1) * 100
        print(f"| {name:22s} | {t['off'] * 1e3:15.3f} | {t['on'] * 1e3:14.3f} | {cost:+6.1f}% |")


if __name__ == "__main__":
    main()
