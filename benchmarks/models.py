"""Whole models, lazygrad against torch eager running the same model in the same run, on the same device (the CPU,
or the GPU when lazygrad's device is CUDA: `DEV=CUDA`): MiniLM sentence embeddings (examples/minilm.py), GPT-2 124M
decoding with a KV cache (examples/gpt2.py, and Hugging Face transformers' eager decoding where it is installed), a
ResNet-18 training step (examples/resnet.py) and a BERT-base forward pass (the MiniLM example's encoder at BERT-base
size with random weights). On a GPU the sizes default to the standard ones: 64 sentences, ResNet-18 at batch 64 on
224x224 images, BERT-base at batch 32 and length 128; on the CPU to smaller ones.

For each model:
- first result: seconds from the model's weights being loaded to the first output, which for lazygrad includes
  scheduling, code generation and compiling every kernel (the compiler's disk cache points at an empty folder);
- steady state: median seconds per step (a batch of sentences, a generated token, a training step) once warm, for
  lazygrad under its JIT;
- kernels: the kernels one steady step launches (lazygrad's captured JIT; torch's counted by its profiler: device
  kernels on a GPU, operator calls on the CPU);
- peak memory: the most device memory held during the model's run (lazygrad's buffers; torch's allocator on a GPU,
  not measured on the CPU).

On a GPU each model runs lazygrad with the `TF32` setting that torch's own flag for the ops it is made of has, as set
(torch's defaults: `torch.backends.cudnn.allow_tf32` True, so ResNet-18's convolutions run on TF32 tensor cores in both;
`torch.backends.cuda.matmul.allow_tf32` False, so the matmuls of MiniLM, GPT-2 and BERT stay float32 in both); the
settings used are printed under the table.

    python benchmarks/models.py                  # every model, CPU-sized inputs
    DEV=CUDA python benchmarks/models.py         # on the GPU, standard sizes, torch on the same GPU
    python benchmarks/models.py --models gpt2 --tokens 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# before lazygrad is imported: compiled kernels from earlier runs must not hide the compile time of the first result
os.environ.setdefault("CACHEDIR", tempfile.mkdtemp(prefix="lazygrad-bench-"))

import numpy as np
from example_modules import example

from lazygrad import Context, Tensor
from lazygrad.engine import CompiledRunner
from lazygrad_uop.device import MemoryUse
from lazygrad_uop.registry import Device


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


def on_gpu() -> bool:
    """Whether lazygrad runs on an NVIDIA GPU (DEV=CUDA)."""
    return Device.DEFAULT.split(":")[0] == "CUDA"


def torch_device() -> str:
    """torch's device for the references: the GPU when lazygrad runs on one (the same GPU), else the CPU."""
    import torch

    if on_gpu():
        if not torch.cuda.is_available():
            sys.exit("lazygrad runs on CUDA but this torch has no CUDA: install a CUDA build of torch to compare")
        return "cuda"
    return "cpu"


def torch_sync() -> None:
    """Wait for torch's queued GPU work (nothing on the CPU)."""
    import torch

    if torch_device() == "cuda":
        torch.cuda.synchronize()


def torch_kernels(fn: Callable[[], Any]) -> int:
    """The kernels one call of `fn` launches in torch: GPU kernels on a GPU, operator calls on the CPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch_device() == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        fn()
        torch_sync()
    events = prof.events()
    if cuda:
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)


class Peaks:
    """The most device memory lazygrad's buffers and torch's allocator held from `start` to `stop`."""

    def start(self) -> None:
        """Start measuring both peaks from what is held now."""
        MemoryUse.reset_peak()
        if torch_device() == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()

    def stop(self) -> tuple[int, int | None]:
        """(lazygrad's peak bytes, torch's peak bytes or None on the CPU)."""
        lg = MemoryUse.peak.get(Device.DEFAULT, 0)
        if torch_device() == "cuda":
            import torch

            return lg, int(torch.cuda.max_memory_allocated())
        return lg, None


# *** the models ***


def minilm(args: argparse.Namespace) -> dict[str, Any]:
    """A batch of sentences -> embeddings."""
    m = example("minilm")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, int(rng.integers(6, 40)))) for _ in range(args.sentences)]
    peaks = Peaks()
    model, tok = m.load()
    reference = m.torch_reference(device=torch_device())
    peaks.start()
    first, got = timed(lambda: m.embed(model, tok, sentences))
    want_first, want = timed(lambda: reference(sentences))
    cos = float(np.min(np.sum(got * want, axis=1)))
    assert cos > 0.9999, f"lazygrad's MiniLM embeddings differ from torch's (cosine {cos})"
    m.embed(model, tok, sentences)  # the JIT captures on the second call
    # the sentences fall into batches of a few shapes, one captured JIT each
    kernels = sum(jit_kernels(j) for j in model._jits.values())
    steady = (
        median_seconds(lambda: m.embed(model, tok, sentences), args.runs),
        median_seconds(lambda: reference(sentences), args.runs),
    )
    return {
        "model": f"MiniLM-L6 embeddings, {args.sentences} sentences",
        "unit": "batch",
        "first": (first, want_first),
        "steady": steady,
        "kernels": (kernels, torch_kernels(lambda: reference(sentences))),
        "memory": peaks.stop(),
    }


def gpt2(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy decoding of `--tokens` tokens after an 8-token prompt; a step is one token. Hugging Face transformers'
    eager decoding of the same weights is timed too where it is installed."""
    g = example("gpt2")
    dev = torch_device()
    peaks = Peaks()
    model = g.GPT2(g.GPT2Config.gpt2_124m(), seed=0)
    prompt = [464, 2068, 7586, 21831, 18045, 625, 262, 16931]
    peaks.start()
    times: list[float] = []
    st = time.perf_counter()
    got = g.generate(model, prompt, args.tokens, timings=times)
    first = times[0] - st
    warm = 3  # the JIT runs the first decode plainly and captures on the second
    steady = statistics.median(np.diff(times[warm:])) if len(times) > warm + 1 else float("nan")
    ttimes: list[float] = []
    st = time.perf_counter()
    want = g.torch_generate(model, prompt, args.tokens, timings=ttimes, device=dev)
    assert got == want, f"lazygrad and torch generate different tokens:\n{got}\n{want}"
    # one decode step's kernels: generating two tokens less generating one
    per_token = torch_kernels(lambda: g.torch_generate(model, prompt, 2, device=dev)) - torch_kernels(
        lambda: g.torch_generate(model, prompt, 1, device=dev)
    )
    return {
        "model": "GPT-2 124M decode (KV cache)",
        "unit": "token",
        "first": (first, ttimes[0] - st),
        "steady": (steady, statistics.median(np.diff(ttimes[warm:]))),
        "kernels": (jit_kernels(model.decode_step), per_token),
        "memory": peaks.stop(),
        "hf": hf_gpt2_decode(model, prompt, args.tokens, got, dev),
        "lazygrad_token": steady,
    }


def hf_gpt2_decode(model: Any, prompt: list[int], count: int, expected: list[int], device: str) -> float | None:
    """Median seconds per token of Hugging Face transformers' eager greedy decoding (with its KV cache) of `model`'s
    weights on torch's `device`, or None where transformers is not installed. Warns when its tokens differ."""
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    c = model.config
    hf = GPT2LMHeadModel(
        GPT2Config(n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head, n_positions=c.n_ctx, vocab_size=c.vocab_size)
    )
    state = {k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()}
    hf.transformer.load_state_dict(state, strict=False)
    hf.lm_head.weight = hf.transformer.wte.weight
    hf = hf.to(device).eval()
    out, times = [], []
    with torch.no_grad():
        res = hf(torch.tensor([prompt], device=device), use_cache=True)
        for _ in range(count):
            out.append(int(res.logits[0, -1].argmax()))
            times.append(time.perf_counter())
            res = hf(torch.tensor([[out[-1]]], device=device), past_key_values=res.past_key_values, use_cache=True)
    if out != expected:
        print(f"warning: transformers' GPT-2 generates other tokens than lazygrad's: {out} vs {expected}")
    return float(statistics.median(np.diff(times[3:]))) if len(times) > 4 else None


def resnet(args: argparse.Namespace) -> dict[str, Any]:
    """One SGD training step of ResNet-18 on random images."""
    import torch

    r = example("resnet")
    dev = torch_device()
    peaks = Peaks()
    model = r.resnet18(num_classes=1000)
    lr = r.LR * args.batch / 256  # the example's default: the linear scaling rule
    _, torch_step = r.torch_reference(model, lr=lr, device=dev)
    step = r.make_train_step(model, lr=lr)
    data = r.random_batches(args.steps, args.batch, args.size, 1000)
    # the batches on the device before the steps are timed, as torch's below are (a copy of 38 MB from the host
    # per step, at batch 64 and 224x224, is no part of either's training step)
    batches = [(Tensor(x).realize(), Tensor(y).realize()) for x, y in data]
    peaks.start()
    losses, times = [], []
    for x, y in batches:
        t, loss = timed(lambda x=x, y=y: step(x, y).item())
        losses.append(loss)
        times.append(t)
    tlosses, ttimes = [], []
    tdata = [(torch.from_numpy(x).to(dev), torch.from_numpy(y).long().to(dev)) for x, y in data]
    for x, y in tdata:
        t, loss = timed(lambda x=x, y=y: torch_step(x, y).item())
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
        "kernels": (jit_kernels(step), torch_kernels(lambda: torch_step(*tdata[0]).item())),
        "memory": peaks.stop(),
    }


def bert(args: argparse.Namespace) -> dict[str, Any]:
    """A BERT-base forward pass (the MiniLM example's encoder, mean pooling included) at batch `--bert-batch` and
    length `--bert-length`, on random weights and token ids."""
    import torch

    m = example("minilm")
    dev = torch_device()
    cfg = m.BertConfig(30522, 768, 12, 12, 3072, 512, 2, 1e-12)
    rng = np.random.default_rng(0)
    checkpoint = random_bert_checkpoint(cfg, rng)
    peaks = Peaks()
    model = m.MiniLM(cfg)
    model.load_checkpoint({k: Tensor(v) for k, v in checkpoint.items()})
    forward = m.torch_encoder(cfg, {k: torch.from_numpy(v).to(dev) for k, v in checkpoint.items()}, dev)
    ids = rng.integers(0, cfg.vocab_size, (args.bert_batch, args.bert_length)).astype(np.int32)
    mask = np.ones_like(ids)

    def run() -> np.ndarray:
        return model(Tensor(ids), Tensor(mask)).numpy()

    def reference() -> np.ndarray:
        with torch.inference_mode():
            return forward(ids, mask).cpu().numpy()

    peaks.start()
    first, got = timed(run)
    want_first, want = timed(reference)
    cos = float(np.min(np.sum(got * want, axis=1)))
    assert cos > 0.999, f"lazygrad's BERT-base output differs from torch's (cosine {cos})"
    run()  # captured on the second call
    return {
        "model": f"BERT-base forward, batch {args.bert_batch} x {args.bert_length}",
        "unit": "batch",
        "first": (first, want_first),
        "steady": (median_seconds(run, args.runs), median_seconds(reference, args.runs)),
        "kernels": (sum(jit_kernels(j) for j in model._jits.values()), torch_kernels(reference)),
        "memory": peaks.stop(),
    }


def random_bert_checkpoint(cfg: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A Hugging Face BertModel state dict of `cfg`'s sizes with BERT's initialisation (normal, std 0.02)."""
    h, f = cfg.hidden_size, cfg.intermediate_size

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    out = {
        "embeddings.word_embeddings.weight": normal(cfg.vocab_size, h),
        "embeddings.position_embeddings.weight": normal(cfg.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": normal(cfg.type_vocab_size, h),
        "embeddings.LayerNorm.weight": np.ones(h, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(h, np.float32),
    }
    linears = {
        "attention.self.query": (h, h),
        "attention.self.key": (h, h),
        "attention.self.value": (h, h),
        "attention.output.dense": (h, h),
        "intermediate.dense": (f, h),
        "output.dense": (h, f),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name, (o, n) in linears.items():
            out[f"{p}{name}.weight"], out[f"{p}{name}.bias"] = normal(o, n), np.zeros(o, np.float32)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            out[f"{p}{name}.weight"], out[f"{p}{name}.bias"] = np.ones(h, np.float32), np.zeros(h, np.float32)
    return out


MODELS = {"minilm": minilm, "gpt2": gpt2, "resnet": resnet, "bert": bert}
# the models whose compute is convolutions (torch runs them through cuDNN); the others' is matmuls (cuBLAS)
CONVOLUTION_MODELS = {"resnet"}


def torch_tf32(name: str) -> bool:
    """Whether torch may use TF32 for the ops model `name` is made of: cuDNN's flag for convolutions, the matmul flag
    for the others, as they are set."""
    import torch

    if name in CONVOLUTION_MODELS:
        return bool(torch.backends.cudnn.allow_tf32)
    return bool(torch.backends.cuda.matmul.allow_tf32)


# (CPU, GPU) defaults of the sizes: the GPU's are the standard ones
SIZES = {
    "sentences": (16, 64),
    "batch": (8, 64),
    "size": (64, 224),
    "bert_batch": (4, 32),
    "bert_length": (32, 128),
}


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--sentences", type=int, default=None, help="MiniLM: sentences per batch (16; GPU 64)")
    parser.add_argument("--tokens", type=int, default=24, help="GPT-2: tokens to generate")
    parser.add_argument("--batch", type=int, default=None, help="ResNet-18: images per step (8; GPU 64)")
    parser.add_argument("--size", type=int, default=None, help="ResNet-18: image height and width (64; GPU 224)")
    parser.add_argument("--steps", type=int, default=6, help="ResNet-18: training steps")
    parser.add_argument("--bert-batch", type=int, default=None, help="BERT-base: sequences per batch (4; GPU 32)")
    parser.add_argument("--bert-length", type=int, default=None, help="BERT-base: tokens per sequence (32; GPU 128)")
    parser.add_argument("--runs", type=int, default=5, help="steady-state calls timed (MiniLM, BERT)")
    args = parser.parse_args(argv)
    for name, sizes in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, sizes[on_gpu()])
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/models.py compares with torch eager: pip install torch")
    torch.manual_seed(0)
    rows, skipped = [], []
    for name in args.models:
        try:
            if on_gpu():
                # lazygrad's float32 on TF32 tensor cores exactly where torch's is
                tf32 = torch_tf32(name)
                with Context(TF32=int(tf32)):
                    rows.append({**MODELS[name](args), "tf32": tf32})
            else:
                rows.append(MODELS[name](args))
        except ImportError as exc:  # a model whose weights or tokenizer package is missing; the others still run
            skipped.append(f"{name} skipped: {exc}")
            print(skipped[-1], file=sys.stderr, flush=True)
    where = f"{Device.DEFAULT}, torch on {torch_device()}"
    if torch_device() == "cuda":
        where += f" ({torch.cuda.get_device_name()})"
    cache = os.environ["CACHEDIR"]
    print(f"\n{where}; {torch.get_num_threads()} torch threads; lazygrad compiles into the empty cache {cache}")
    head = f"{'model':44s} {'first result lazygrad / torch':>30s} {'steady lazygrad / torch':>26s} {'torch/lg':>9s}"
    print(head + f" {'kernels lg / torch':>19s} {'peak MiB lg / torch':>20s}")
    for r in rows:
        (f_lg, f_t), (s_lg, s_t) = r["first"], r["steady"]
        first = f"{f_lg:9.2f} s / {f_t:7.3f} s"
        steady = f"{s_lg * 1e3:8.1f} / {s_t * 1e3:7.1f} ms/{r['unit']}"
        kernels = f"{r['kernels'][0]} / {r['kernels'][1]}"
        memory = f"{_mb(r['memory'][0])} / {_mb(r['memory'][1])}"
        print(f"{r['model']:44s} {first:>30s} {steady:>26s} {s_t / s_lg:9.2f} {kernels:>19s} {memory:>20s}")
    if on_gpu():
        print(
            f"TF32: torch cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, "
            f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}; lazygrad TF32="
            + ", ".join(f"{int(r['tf32'])} ({r['model'].split(',')[0]})" for r in rows)
        )
    for line in skipped:
        print(line)
    for r in rows:
        if "hf" in r:
            hf = r["hf"]
            if hf is None:
                print("GPT-2 against Hugging Face transformers: not installed (pip install transformers)")
            else:
                lg = r["lazygrad_token"]
                print(
                    f"GPT-2 decode: lazygrad {lg * 1e3:.2f} ms/token, transformers eager {hf * 1e3:.2f} ms/token, "
                    f"{hf / lg:.2f}x"
                )


if __name__ == "__main__":
    main()
