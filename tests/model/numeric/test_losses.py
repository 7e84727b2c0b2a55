"""Numeric losses, the lambda ramp and RnedHead (loss choice, protocol)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model.numeric.codec import RotaryNumberCodec
from model.numeric.losses import (
    LambdaRamp,
    candidate_softmax_loss,
    rotation_cosine_loss,
    score_mse_loss,
)
from model.numeric.protocol import NumericHead
from model.numeric.rned_head import RnedHead

PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
VALUES = st.lists(st.integers(0, 30000), min_size=1, max_size=8).map(lambda k: [i / 10 for i in k])


@pytest.fixture(scope="module")
def codec() -> RotaryNumberCodec:
    return RotaryNumberCodec(128, seed=7).double()


def leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def softmax(codec: RotaryNumberCodec, hidden: torch.Tensor, values: object) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return candidate_softmax_loss(codec, hidden, values, generator=generator)  # type: ignore[arg-type]


# --- minimal at the target, positive elsewhere, gradients ----------------------------------------


@PROPERTY
@given(VALUES)
def test_losses_vanish_at_the_exact_target(codec: RotaryNumberCodec, values: list[float]) -> None:
    hidden = codec.encode(values)  # (N, D) float64
    assert float(rotation_cosine_loss(codec, hidden, values)) < 1e-12
    assert float(score_mse_loss(codec, hidden, values)) < 1e-24
    assert float(score_mse_loss(codec, hidden, values, normalize=False)) < 1e-24


@PROPERTY
@given(VALUES, st.floats(0.5, 2000.0))
def test_losses_are_positive_away_from_the_target(
    codec: RotaryNumberCodec, values: list[float], shift: float
) -> None:
    wrong = [(v + shift) % 3000.0 for v in values]
    hidden = codec.encode(wrong)
    assert float(rotation_cosine_loss(codec, hidden, values)) > 1e-6
    assert float(score_mse_loss(codec, hidden, values)) > 0
    assert float(softmax(codec, hidden, values)) > float(
        softmax(codec, codec.encode(values), values)
    )


def test_softmax_is_lowest_at_the_target(codec: RotaryNumberCodec) -> None:
    values = [0.0, 41.5, 1500.0, 3000.0]  # includes both ends: the window is clipped there
    at_target = float(softmax(codec, codec.encode(values), values))
    for shift in (-0.5, 0.3, 2.0, 50.0):
        moved = [min(max(v + shift, 0.0), 3000.0) for v in values]
        assert float(softmax(codec, codec.encode(moved), values)) > at_target
    noise = torch.randn(4, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert float(softmax(codec, noise, values)) > at_target


def test_softmax_with_only_the_truth_is_zero(codec: RotaryNumberCodec) -> None:
    hidden = torch.randn(3, 128, dtype=torch.float64)
    loss = candidate_softmax_loss(codec, hidden, [1.0, 2.0, 3.0], window=0.0, negatives=0)
    assert float(loss) == 0.0


@pytest.mark.parametrize("name", ["cosine", "softmax", "score_mse"])
def test_gradients_flow_to_bf16_and_float32_hidden(codec: RotaryNumberCodec, name: str) -> None:
    values = [3.0, 250.5, 999.9]
    loss_fn = {
        "cosine": lambda h: rotation_cosine_loss(codec, h, values),
        "softmax": lambda h: softmax(codec, h, values),
        "score_mse": lambda h: score_mse_loss(codec, h, values),
    }[name]
    for dtype in (torch.bfloat16, torch.float32):
        hidden = leaf(codec.encode([10.0, 20.0, 30.0]).to(dtype))
        loss = loss_fn(hidden)
        assert loss.dtype == torch.float32 and loss.dim() == 0
        loss.backward()
        assert hidden.grad is not None and hidden.grad.dtype == dtype
        assert torch.isfinite(hidden.grad).all() and hidden.grad.abs().sum() > 0


def test_score_mse_trains_one_direction_only(codec: RotaryNumberCodec) -> None:
    """Its gradient is parallel to u = omega^-p x_base for every row: why the notes want a
    whole-vector loss for the correlation decoder."""
    hidden = leaf(torch.randn(4, 128, dtype=torch.float64))
    score_mse_loss(codec, hidden, [1.0, 2.0, 3.0, 4.0]).backward()
    assert hidden.grad is not None
    u = codec.score_vector
    cos = torch.nn.functional.cosine_similarity(hidden.grad, u[None, :].expand(4, -1), dim=-1)
    assert torch.allclose(cos.abs(), torch.ones(4, dtype=torch.float64))


def test_score_mse_forms(codec: RotaryNumberCodec) -> None:
    hidden = torch.randn(5, 128, dtype=torch.float64)
    values = [0.0, 1.0, 2.0, 3.0, 4.0]
    paper = ((codec.score(hidden) - codec.target_score(values)) ** 2).mean()
    assert torch.allclose(score_mse_loss(codec, hidden, values, normalize=False), paper)
    normalised = score_mse_loss(codec, hidden, values)
    assert torch.allclose(normalised, paper / codec.score_range**2)


def test_cosine_ignores_the_norm(codec: RotaryNumberCodec) -> None:
    hidden = torch.randn(2, 128, dtype=torch.float64)
    values = [5.0, 6.0]
    base = rotation_cosine_loss(codec, hidden, values)
    assert torch.allclose(rotation_cosine_loss(codec, 37.0 * hidden, values), base)


def test_softmax_negatives_follow_the_generator(codec: RotaryNumberCodec) -> None:
    hidden = torch.randn(2, 128, dtype=torch.float64)

    def draw(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return candidate_softmax_loss(codec, hidden, [5.0, 6.0], generator=generator)

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_empty_batches_give_a_zero_with_a_graph(codec: RotaryNumberCodec) -> None:
    for fn in (rotation_cosine_loss, score_mse_loss, candidate_softmax_loss):
        hidden = leaf(torch.zeros(0, 128))
        loss = fn(codec, hidden, [])
        assert float(loss.detach()) == 0.0 and loss.requires_grad
        loss.backward()


def test_loss_inputs_are_checked(codec: RotaryNumberCodec) -> None:
    hidden = torch.zeros(2, 128, dtype=torch.float64)
    with pytest.raises(ValueError, match="2 rows"):
        rotation_cosine_loss(codec, hidden, [1.0])
    with pytest.raises(ValueError, match=r"shape \(N, 128\)"):
        score_mse_loss(codec, torch.zeros(2, 64), [1.0, 2.0])
    with pytest.raises(ValueError, match=r"values\[1\] = 3001"):
        rotation_cosine_loss(codec, hidden, [1.0, 3001.0])
    for kwargs in ({"kappa": 0.0}, {"sigma": -1.0}, {"window": -1.0}, {"negatives": -1}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            candidate_softmax_loss(codec, hidden, [1.0, 2.0], **kwargs)  # type: ignore[arg-type]


# --- lambda ramp ---------------------------------------------------------------------------------


@given(
    st.integers(0, 1000),
    st.integers(1, 1000),
    st.floats(0.0, 100.0),
    st.integers(-10, 3000),
)
def test_ramp_is_linear_and_clamped(start: int, length: int, top: float, step: int) -> None:
    ramp = LambdaRamp(start, start + length, top)
    value = ramp(step)
    if step <= start:
        assert value == 0.0
    elif step >= start + length:
        assert value == top
    else:
        assert value == pytest.approx(top * (step - start) / length)
    assert 0.0 <= value <= top
    assert ramp(step) <= ramp(step + 1)


def test_ramp_edges() -> None:
    ramp = LambdaRamp(10, 20, 0.5)
    assert [ramp(s) for s in (0, 10, 15, 20, 10_000)] == [0.0, 0.0, 0.25, 0.5, 0.5]
    jump = LambdaRamp(5, 5, 2.0)
    assert (jump(4), jump(5)) == (0.0, 2.0)
    for args, name in (((-1, 5, 1.0), "start_step"), ((5, 4, 1.0), "end_step")):
        with pytest.raises(ValueError, match=name):
            LambdaRamp(*args)
    for top in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="max_lambda"):
            LambdaRamp(0, 1, top)


# --- RnedHead ------------------------------------------------------------------------------------


def test_head_implements_the_protocol() -> None:
    codec = RotaryNumberCodec(64)
    corr, rnd = RnedHead(codec), RnedHead(codec, method="rnd")
    for head, name, loss in ((corr, "rned_corr", "softmax"), (rnd, "rned_rnd", "score_mse")):
        assert isinstance(head, NumericHead)
        assert (head.name, head.loss_name) == (name, loss)
    values = torch.tensor([1.5, 299.0])
    assert torch.equal(corr.embed(values), codec.encode(values))
    hidden = corr.embed(values)
    assert torch.equal(corr.decode(hidden), codec.decode(hidden, "corr"))
    assert torch.equal(rnd.decode(hidden), codec.decode(hidden, "rnd"))
    assert "x_base" in "".join(corr.state_dict())


@pytest.mark.parametrize("name", ["cosine", "softmax", "score_mse"])
def test_head_loss_is_the_chosen_loss(name: str) -> None:
    codec = RotaryNumberCodec(64)
    options = {"softmax": {"generator": torch.Generator().manual_seed(0)}}.get(name, {})
    head = RnedHead(codec, method="corr", loss=name, loss_options=options)  # type: ignore[arg-type]
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    values = torch.tensor([1.0, 2.0, 3.0])
    expected = {
        "cosine": lambda: rotation_cosine_loss(codec, hidden, values),
        "softmax": lambda: candidate_softmax_loss(
            codec, hidden, values, generator=torch.Generator().manual_seed(0)
        ),
        "score_mse": lambda: score_mse_loss(codec, hidden, values),
    }[name]()
    assert torch.equal(head.loss(hidden, values), expected)


def test_head_arguments_are_checked() -> None:
    codec = RotaryNumberCodec(64)
    with pytest.raises(ValueError, match="method"):
        RnedHead(codec, method="linear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loss"):
        RnedHead(codec, loss="mse")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kappa"):
        RnedHead(codec, loss="cosine", loss_options={"kappa": 3.0})
    with pytest.raises(ValueError, match="codec"):
        RnedHead(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
