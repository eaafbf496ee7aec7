"""lazygrad in one screen: build a lazy graph, look at the kernels it becomes, run them, check against numpy.

Run:  python examples/quickstart.py        (DEBUG=4 also prints the generated source)
"""

import numpy as np

from lazygrad import Context, Device, Tensor
from lazygrad_uop.config import DEBUG


def main() -> None:
    print(f"default device: {Device.DEFAULT}")
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((4, 8)).astype(np.float32)
    w_np = rng.standard_normal((8, 3)).astype(np.float32)
    x, w = Tensor(x_np), Tensor(w_np)

    # nothing runs yet: these build a graph
    logits = (x @ w).relu()
    e = (logits - logits.max(-1, keepdim=True)).exp()
    probs = e / e.sum(-1, keepdim=True)
    total = (x * 2 + 1).sum()

    schedule = probs.schedule(total)
    print(f"\n{len(schedule)} kernels for a matmul+relu+softmax and a fused (x*2+1).sum():")
    # at least DEBUG=2 (kernel times); a higher DEBUG from the environment (4: source) is kept
    with Context(DEBUG=max(DEBUG.value, 2)):
        Tensor.realize(probs, total)

    ref_logits = np.maximum(x_np @ w_np, 0)
    ref = np.exp(ref_logits - ref_logits.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total.item(), (x_np * 2 + 1).sum(), rtol=1e-5)
    print(f"\nprobs[0] = {probs.numpy()[0]}  (matches numpy)")
    print(f"sum      = {total.item():.4f}  (matches numpy)")


if __name__ == "__main__":
    main()
