"""examples/resnet.py: three jitted SGD steps of a narrow ResNet-18 (the real topology, 8 channels after the stem,
64x64 images) match the same network written independently in torch, in the losses, the parameters and the
BatchNorm running statistics; and the third step is a replay of captured kernels, with nothing scheduled or
compiled.

The sizes keep the comparison well conditioned: at 32x32 the last stage sees 1x1 feature maps, its batch statistics
come from 4 values, and at lr 0.1 float32 rounding alone (torch in float32 against float64) moves the third loss by
2e-3 and the fourth by 0.4. At 64x64 and lr 0.01 the two agree to 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

import lazygrad.engine
from lazygrad import Tensor
from lazygrad.nn.state import get_state_dict

WIDTH, SIZE, BATCH, CLASSES, LR, STEPS = 8, 64, 4, 10, 0.01, 3


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[tuple]:
    """Wrap `owner.name` (for the rest of the test) so that each call appends its arguments to the returned list."""
    calls: list[tuple] = []
    original = getattr(owner, name)

    def counted(*args: object) -> object:
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_names_and_sizes_follow_resnet18(load_example) -> None:
    example = load_example("resnet")
    Tensor.manual_seed(0)
    model = example.resnet18()
    state = get_state_dict(model)
    trainable = [k for k in state if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    # 11,689,512 parameters is ResNet-18's published count (the paper's 1.8 GFLOPs network at 224x224)
    assert sum(state[k].numel() for k in trainable) == 11_689_512
    assert state["layer2.0.downsample.0.weight"].shape == (128, 64, 1, 1)
    assert "layer1.0.downsample.0.weight" not in state  # the first stage keeps its shape: identity shortcuts
    assert state["fc.weight"].shape == (1000, 512)


def test_three_jitted_steps_match_torch(monkeypatch: pytest.MonkeyPatch, load_example) -> None:
    torch = pytest.importorskip("torch")
    example = load_example("resnet")
    Tensor.manual_seed(0)
    model = example.resnet18(CLASSES, WIDTH)
    torch_net, torch_step = example.torch_reference(model, lr=LR)
    start = {k: v.numpy().copy() for k, v in get_state_dict(model).items()}
    step = example.make_train_step(model, lr=LR)
    batches = example.random_batches(STEPS, BATCH, SIZE, CLASSES, seed=1)

    forwards = _count_calls(monkeypatch, example.ResNet, "__call__")
    losses, torch_losses = [], []
    for i, (x, y) in enumerate(batches):
        if i == STEPS - 1:  # the replay: count what gets scheduled or compiled outside the captured kernels
            scheduled = _count_calls(monkeypatch, lazygrad.engine, "lower_schedule_item")
            compiled = _count_calls(monkeypatch, lazygrad.engine, "get_runner")
        losses.append(step(Tensor(x), Tensor(y)).item())
        torch_losses.append(torch_step(torch.from_numpy(x), torch.from_numpy(y).long()).item())

    np.testing.assert_allclose(losses, torch_losses, rtol=0, atol=1e-4)
    assert len(forwards) == 2 and not scheduled and not compiled, "the third step should replay the captured kernels"
    assert len(step.jit_cache) > 0

    ours, theirs = get_state_dict(model), torch_net.state_dict()
    for name in ("conv1.weight", "layer2.0.downsample.0.weight", "layer4.1.conv2.weight", "fc.weight", "fc.bias"):
        # compare the change the three steps made: it is what the optimizer computed, and far smaller than the weight
        delta, torch_delta = ours[name].numpy() - start[name], theirs[name].numpy() - start[name]
        assert np.abs(torch_delta).max() > 1e-4, f"{name} hardly moved; the check would prove nothing"
        np.testing.assert_allclose(delta, torch_delta, rtol=1e-3, atol=2e-3 * np.abs(torch_delta).max(), err_msg=name)
    for name in ("bn1", "layer1.0.bn1", "layer3.1.bn2", "layer4.0.downsample.1"):
        for stat in ("running_mean", "running_var", "weight", "bias"):
            key = f"{name}.{stat}"
            np.testing.assert_allclose(ours[key].numpy(), theirs[key].numpy(), rtol=1e-4, atol=1e-5, err_msg=key)
        assert ours[f"{name}.num_batches_tracked"].item() == STEPS
