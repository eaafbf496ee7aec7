"""Compile speed: how long a real model's first step takes when every kernel must be scheduled, generated and
compiled (cold: an empty cache directory), and how long it takes again in a fresh process once the disk cache holds
what the first run produced (warm).

Workloads (CPU unless DEV says otherwise), each timed from its weights being ready to its first result:
- resnet: one ResNet-18 SGD training step, batch 8 at 64x64 (examples/resnet.py);
- gpt2: GPT-2 124M, an 8-token prompt and the first generated token (examples/gpt2.py);
- convnet: one Adam training step of examples/train_digits.py's conv net, batch 64.

Every measurement runs in its own process. The reference is torch eager's first step of the same model in the same
run (ResNet-18 and GPT-2, from the examples' torch versions), where torch is installed. The tinygrad column appears
only where tinygrad is installed (this benchmark installs nothing), for the conv net written against tinygrad's API,
with its own empty cache.

    python benchmarks/compile.py                          # all workloads, cold then warm
    python benchmarks/compile.py --workloads resnet --repeat 3
    python benchmarks/compile.py --profile resnet         # cProfile of a cold first step, top functions
    python benchmarks/compile.py --profile resnet --warm  # the same with a cache a first run filled
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from example_modules import example

TARGETS = {"resnet": (8.0, 3.0), "gpt2": (1.5, None), "convnet": (1.5, None)}  # seconds: cold, warm


# *** the workloads: each builds its model and returns the first step as a function ***


def resnet_step() -> Callable[[], object]:
    """ResNet-18's first training step, batch 8 at 64x64."""
    from lazygrad import Tensor

    r = example("resnet")
    Tensor.manual_seed(0)
    model = r.resnet18(num_classes=1000)
    step = r.make_train_step(model, lr=r.LR * 8 / 256)
    ((x, y),) = r.random_batches(1, 8, 64, 1000)
    return lambda: step(Tensor(x), Tensor(y)).item()


def gpt2_step() -> Callable[[], object]:
    """GPT-2 124M: an 8-token prompt and the first generated token."""
    g = example("gpt2")
    model = g.GPT2(g.GPT2Config.gpt2_124m(), seed=0)
    prompt = [464, 2068, 7586, 21831, 18045, 625, 262, 16931]
    return lambda: g.generate(model, prompt, 1)


def convnet_step() -> Callable[[], object]:
    """examples/train_digits.py's conv net: the first Adam training step on a batch of 64 random 8x8 images."""
    import numpy as np

    from lazygrad import Tensor
    from lazygrad.nn.optim import Adam
    from lazygrad.nn.state import get_parameters

    d = example("train_digits")
    Tensor.manual_seed(0)
    model = d.DigitsNet()
    train_step = d.make_train_step(model, Adam(get_parameters(model), lr=1e-2))

    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 8, 8), dtype=np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    return lambda: train_step(Tensor(x), Tensor(y)).item()


WORKLOADS = {"resnet": resnet_step, "gpt2": gpt2_step, "convnet": convnet_step}


def torch_step(name: str) -> Callable[[], object]:
    """The reference: the same first step in torch eager (the examples' torch versions; none for the conv net)."""
    import torch

    if name == "resnet":
        from lazygrad import Tensor

        r = example("resnet")
        Tensor.manual_seed(0)
        _, step = r.torch_reference(r.resnet18(num_classes=1000), lr=r.LR * 8 / 256)
        ((x, y),) = r.random_batches(1, 8, 64, 1000)
        return lambda: step(torch.from_numpy(x), torch.from_numpy(y).long()).item()
    if name == "gpt2":
        g = example("gpt2")
        model = g.GPT2(g.GPT2Config.gpt2_124m(), seed=0)
        return lambda: g.torch_generate(model, [464, 2068, 7586, 21831, 18045, 625, 262, 16931], 1)
    raise NotImplementedError(f"no torch version of the {name} workload")


def tinygrad_step(name: str) -> Callable[[], object]:
    """The conv net workload written against tinygrad (only called where tinygrad is installed). ResNet-18 and GPT-2
    have no tinygrad version here: tinygrad's package ships no model definitions, and a hand port would measure the
    port."""
    import numpy as np
    from tinygrad import Tensor, TinyJit, nn

    if name != "convnet":
        raise NotImplementedError(f"no tinygrad version of the {name} workload")

    class Net:
        def __init__(self) -> None:
            self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
            self.fc = nn.Linear(32 * 4 * 4, 10)

        def __call__(self, x: Tensor) -> Tensor:
            return self.fc(self.c2(self.c1(x).relu()).relu().max_pool2d(2).flatten(1))

    model = Net()
    opt = nn.optim.Adam(nn.state.get_parameters(model), lr=1e-2)

    @TinyJit
    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, 64).astype(np.int32)
    return lambda: step(Tensor(x), Tensor(y)).item()


# *** one measurement per process ***


def measure(name: str, framework: str) -> float:
    """Seconds of the first step of workload `name`, in this process."""
    makers = {"lazygrad": WORKLOADS[name], "tinygrad": lambda: tinygrad_step(name), "torch": lambda: torch_step(name)}
    step = makers[framework]()
    st = time.perf_counter()
    step()
    return time.perf_counter() - st


def run_child(name: str, framework: str, cachedir: str) -> float:
    """`measure` in a fresh process whose compile cache is `cachedir`."""
    # CACHEDB: where tinygrad keeps its cache
    env = {**os.environ, "CACHEDIR": cachedir, "CACHEDB": os.path.join(cachedir, "tinygrad.db"), "PROGRESS": "0"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--framework", framework],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def profile(name: str, top: int, warm: bool = False, cachedir: str | None = None) -> None:
    """cProfile of workload `name`'s first step, sorted by cumulative and by own time: with an empty cache, or
    (`warm`) with a cache that a first run in another process filled, so that what remains is everything but code
    generation and compilation. `cachedir`: the cache directory to use (a warm profile fills it only when empty)."""
    import cProfile
    import pstats

    cachedir = cachedir or tempfile.mkdtemp(prefix="lazygrad-compile-profile-")
    if warm and not any(Path(cachedir).iterdir()):
        print(f"{name}: filling the cache, first step {run_child(name, 'lazygrad', cachedir):.2f} s (cold)")
    os.environ["CACHEDIR"] = cachedir
    step = WORKLOADS[name]()
    prof = cProfile.Profile()
    st = time.perf_counter()
    prof.runcall(step)
    print(f"{name}: {'warm' if warm else 'cold'} first step {time.perf_counter() - st:.2f} s (under cProfile)")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=1, help="cold/warm pairs per workload; medians are reported")
    parser.add_argument("--profile", choices=sorted(WORKLOADS), help="profile one workload's cold first step")
    parser.add_argument("--top", type=int, default=40, help="with --profile: functions listed")
    parser.add_argument("--warm", action="store_true", help="with --profile: profile the warm first step")
    parser.add_argument("--cachedir", help="with --profile: the cache directory (default: a new empty one)")
    parser.add_argument("--child", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--framework", default="lazygrad", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps({"seconds": measure(args.child, args.framework)}))
        return
    if args.profile:
        profile(args.profile, args.top, args.warm, args.cachedir)
        return
    has_torch = importlib.util.find_spec("torch") is not None
    frameworks = ["lazygrad"] + (["tinygrad"] if importlib.util.find_spec("tinygrad") else [])
    results: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for name in args.workloads:
        for fw in frameworks if name == "convnet" else ["lazygrad"]:
            cold: list[float] = []
            warm: list[float] = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(prefix="lazygrad-compile-bench-") as cachedir:
                    try:
                        cold.append(run_child(name, fw, cachedir))
                        warm.append(run_child(name, fw, cachedir))
                    except subprocess.CalledProcessError as exc:
                        print(f"{fw} {name} failed:\n{exc.stderr[-2000:]}", file=sys.stderr)
                        break
            results[name, fw] = (cold, warm)
        if has_torch and name != "convnet":
            with tempfile.TemporaryDirectory(prefix="lazygrad-compile-bench-") as cachedir:
                results[name, "torch"] = ([run_child(name, "torch", cachedir) for _ in range(args.repeat)], [])
    print(f"\nfirst step, seconds (median of {args.repeat}); cold: empty cache directory, warm: a fresh process")
    head = (
        f"{'workload':10s} {'cold':>8s} {'warm':>8s} {'cold/warm':>9s} {'torch eager':>11s} {'target cold/warm':>17s}"
    )
    if "tinygrad" in frameworks:
        head += f" {'tinygrad cold':>14s} {'tinygrad warm':>14s}"
    print(head)

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):8.2f}" if xs else f"{'-':>8s}"

    for name in args.workloads:
        cold, warm = results[name, "lazygrad"]
        tc, tw = TARGETS[name]
        target = f"{tc:g} / {tw:g}" if tw is not None else f"{tc:g} / -"
        ratio = f"{statistics.median(cold) / statistics.median(warm):9.1f}" if cold and warm else f"{'-':>9s}"
        torch_first = results.get((name, "torch"), ([], []))[0]
        line = f"{name:10s} {med(cold)} {med(warm)} {ratio} {med(torch_first):>11s} {target:>17s}"
        if "tinygrad" in frameworks:
            tg_cold, tg_warm = results.get((name, "tinygrad"), ([], []))
            line += f" {med(tg_cold):>14s} {med(tg_warm):>14s}"
        print(line)


if __name__ == "__main__":
    main()
