"""NumericLM on tiny random transformers models (no download; built from config classes).

The acceptance check: incremental generation with [NUM] feedback gives the same logits and values
as one full forward pass over the final sequences (tiny Qwen2.5-VL, batch of 4, within 1e-4), for
RNED (corr, rnd) and xVal, greedy and seeded sampling. Also: our positions / KV-cache handling is
bit-identical to transformers' own ``generate`` and ``forward`` in standard-token mode, training
losses and gradients, numeric loss only at [NUM] targets, a text-only causal LM, the xVal head.

The tiny models' token ids and configuration are in ``tests/support/models.py`` (shared with the
FLOP tests); the fixtures built from them are this module's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from transformers import (
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from model.numeric.codec import RotaryNumberCodec
from model.numeric.generation import NumericGeneration, TokenAutomaton, select_next_token
from model.numeric.hf import NumericLM
from model.numeric.kv_cache import PreallocatedLayer, preallocated_cache
from model.numeric.protocol import NumericHead
from model.numeric.rned_head import RnedHead
from model.numeric.xval import XValHead

from tests.support.models import (
    ATTN,
    BOS,
    EOS,
    HIDDEN,
    IMAGE,
    NUM,
    PAD,
    VIDEO,
    VISION_END,
    VISION_START,
    VOCAB,
    tiny_vl_config,
)

# --- tiny models ---------------------------------------------------------------------------------

LO, HI = 0.0, 300.0  # value range of the heads
TOL = 1e-4


@dataclass(frozen=True)
class TinyImage:
    """One small image as the Qwen2.5-VL processor would give it."""

    pixel_values: torch.Tensor  # (16, 1176): 4 x 4 patches of 2 x 3 x 14 x 14
    image_grid_thw: torch.Tensor  # (1, 3): t = 1, h = 4, w = 4 patches -> 4 image tokens


@pytest.fixture(scope="module")
def tiny_vl() -> Qwen2_5_VLForConditionalGeneration:
    """A random tiny Qwen2.5-VL, eval mode, float32, seed 0."""
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(tiny_vl_config()).eval()


@pytest.fixture(scope="module")
def tiny_text_lm() -> Qwen2ForCausalLM:
    """A random tiny text-only Qwen2 causal LM, eval mode, float32, seed 0."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.1,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        attn_implementation=ATTN,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def image() -> TinyImage:
    generator = torch.Generator().manual_seed(1)
    return TinyImage(
        pixel_values=torch.randn(16, 3 * 2 * 14 * 14, generator=generator),
        image_grid_thw=torch.tensor([[1, 4, 4]]),
    )


HEADS = ["rned_corr", "rned_rnd", "xval"]


def make_head(kind: str) -> NumericHead:
    """The real heads, seeded, with [NUM] embeddings of the tiny models' embedding scale."""
    if kind == "xval":
        torch.manual_seed(1)
        return XValHead(HIDDEN, lo=LO, hi=HI, init_std=0.1)
    codec = RotaryNumberCodec(HIDDEN, lo=LO, hi=HI, step=0.1, seed=0, scale=0.1)
    return RnedHead(codec, method=kind.removeprefix("rned_"))


# --- prompts -------------------------------------------------------------------------------------

IMG = [VISION_START, IMAGE, IMAGE, IMAGE, IMAGE, VISION_END]
VL_ROWS = [
    [BOS, *IMG, 10, 11, NUM, 12],  # an image and a [NUM] in the prompt
    [BOS, 20, 21, NUM, 22, NUM, 23],
    [BOS, 30],
    [BOS, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],
]
TEXT_ROWS = [row for row in VL_ROWS[1:]] + [[BOS, 60, NUM, 61]]
PROMPT_VALUES = {"vl": [12.5, 7.0, 250.0], "text": [7.0, 250.0, 0.3]}
# (row, step) -> forced token: [NUM] at different steps per row, two rows at step 1, one at the
# last step (decoded, never fed back); EOS in row 2, whose later tokens are padding
FORCED = {
    **{(0, 1): NUM, (0, 6): NUM, (1, 0): NUM, (1, 1): NUM, (2, 2): NUM, (3, 4): NUM, (3, 7): NUM},
    (2, 5): EOS,
}
NUM_STEPS = [[1, 6], [0, 1], [2], [4, 7]]
MAX_NEW = 8


def left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (B, P) left-padded ids and their attention mask."""
    width = max(map(len, rows))
    ids = torch.tensor([[PAD] * (width - len(row)) + row for row in rows])
    return ids, (ids != PAD).long()


def forcing(prompt_length: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A logits processor: [NUM] and EOS only where FORCED says, and there for sure."""

    def process(sequences: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = sequences.shape[1] - prompt_length
        scores[:, [NUM, EOS]] = float("-inf")
        for (row, at), token in FORCED.items():
            if at == step:
                scores[row, token] = 1e9
        return scores

    return process


def values(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def check_against_full_forward(
    lm: NumericLM, gen: NumericGeneration, head: NumericHead, **vision: torch.Tensor
) -> float:
    """Full forward over gen.sequences: logits at every generated step and decoded values must
    match the incremental loop. Returns the max |logits difference|."""
    assert gen.logits is not None
    p, steps = gen.prompt_length, gen.logits.shape[1]
    with torch.no_grad():
        full = lm(gen.sequences, gen.attention_mask, gen.num_values, **vision)
    active = gen.attention_mask[:, p - 1 : p - 1 + steps].bool()  # (B, T) row still generating
    full_logits = full.logits[:, p - 1 : p - 1 + steps].float()  # (B, T, V)
    diff = float((full_logits - gen.logits).abs()[active].max())
    assert diff <= TOL, f"incremental vs full forward logits differ by {diff:.3g}"

    generated = full.num_positions[:, 1] >= p - 1  # [NUM] targets among the generated tokens
    redecoded = head.decode(full.num_hidden[generated])  # (K,) row-major, like gen.values
    fed_back = torch.cat(gen.values)
    if head.name == "xval":  # continuous: same up to the float32 noise of the hidden states
        torch.testing.assert_close(redecoded, fed_back, rtol=0, atol=1e-3 * (HI - LO))
    else:  # grid decoders: the same grid values
        assert torch.equal(redecoded, fed_back), (redecoded, fed_back)
    # each value's decode confidence, aligned with it: the head's own measure, or NaN
    assert [c.shape for c in gen.confidences] == [v.shape for v in gen.values]
    recorded = torch.cat(gen.confidences)
    expected = head.confidence(full.num_hidden[generated], fed_back)
    if expected is None:
        assert bool(recorded.isnan().all())
    else:
        torch.testing.assert_close(recorded, expected, rtol=0, atol=1e-4)
    return diff


# --- the acceptance check ------------------------------------------------------------------------


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("kind", HEADS)
def test_incremental_generation_matches_one_full_forward(
    tiny_vl: Qwen2_5_VLForConditionalGeneration, image: TinyImage, kind: str, do_sample: bool
) -> None:
    head = make_head(kind)
    lm = NumericLM(tiny_vl, head, NUM)
    ids, mask = left_pad(VL_ROWS)
    vision = {"pixel_values": image.pixel_values, "image_grid_thw": image.image_grid_thw}
    gen = lm.generate(
        ids,
        mask,
        values(PROMPT_VALUES["vl"]),
        max_new_tokens=MAX_NEW,
        do_sample=do_sample,
        temperature=0.8,
        top_k=100,
        top_p=0.95,
        generator=torch.Generator().manual_seed(0),
        logits_processor=forcing(ids.shape[1]),
        output_logits=True,
        **vision,
    )
    # the first step's logits are kept whether or not every step's are asked for
    assert gen.first_logits is not None and gen.logits is not None
    assert torch.equal(gen.first_logits, gen.logits[:, 0])
    # the feedback path ran: [NUM] at the forced steps, one value each; row 2 stopped at EOS
    assert [(row == NUM).nonzero().flatten().tolist() for row in gen.new_tokens] == NUM_STEPS
    assert [len(v) for v in gen.values] == [len(s) for s in NUM_STEPS]
    assert gen.new_tokens.shape[1] == MAX_NEW
    assert gen.new_tokens[2, 5] == EOS and gen.new_tokens[2, 6:].eq(PAD).all()
    new_mask = gen.attention_mask[:, gen.prompt_length :]  # (B, T)
    assert new_mask[2, 6:].eq(0).all() and new_mask[[0, 1, 3]].eq(1).all()

    check_against_full_forward(lm, gen, head, **vision)

    # the check is sensitive: a different value fed back changes the logits after it
    wrong = gen.num_values.clone()
    wrong[1] = wrong[1] + 25.0 if wrong[1] < HI / 2 else wrong[1] - 25.0  # row 0's first output
    with torch.no_grad():
        other = lm(gen.sequences, gen.attention_mask, wrong, **vision).logits
        same = lm(gen.sequences, gen.attention_mask, gen.num_values, **vision).logits
    p = gen.prompt_length
    assert float((other[0, p + 1 :] - same[0, p + 1 :]).abs().max()) > 1e-2


@pytest.mark.parametrize("kind", HEADS)
def test_text_only_causal_lm(tiny_text_lm: Qwen2ForCausalLM, kind: str) -> None:
    """The same loop on a plain (non-VL) transformers causal LM: 1-D positions, left padding."""
    head = make_head(kind)
    lm = NumericLM(tiny_text_lm, head, NUM)
    ids, mask = left_pad(TEXT_ROWS)
    gen = lm.generate(
        ids,
        mask,
        values(PROMPT_VALUES["text"]),
        max_new_tokens=MAX_NEW,
        logits_processor=forcing(ids.shape[1]),
        output_logits=True,
    )
    assert [(row == NUM).nonzero().flatten().tolist() for row in gen.new_tokens] == NUM_STEPS
    check_against_full_forward(lm, gen, head)


# --- positions and cache against transformers itself ---------------------------------------------


def test_standard_mode_matches_transformers_generate(
    tiny_vl: Qwen2_5_VLForConditionalGeneration, image: TinyImage
) -> None:
    """Head None: our loop gives transformers' greedy tokens and logits (mrope deltas, cache,
    left padding, an image) and our forward its logits."""
    lm = NumericLM(tiny_vl, None, None)
    ids, mask = left_pad([[BOS, *IMG, 10, 11, 12], [BOS, 20, 21, 22, 23], [BOS, 30]])
    vision = {"pixel_values": image.pixel_values, "image_grid_thw": image.image_grid_thw}
    ours = lm.generate(ids, mask, max_new_tokens=6, eos_token_id=[], output_logits=True, **vision)
    theirs = tiny_vl.generate(
        input_ids=ids,
        attention_mask=mask,
        mm_token_type_ids=(ids == IMAGE).int(),
        max_new_tokens=6,
        min_new_tokens=6,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **vision,
    )
    assert torch.equal(ours.sequences, theirs.sequences)
    assert ours.logits is not None
    assert float((torch.stack(theirs.logits, dim=1) - ours.logits).abs().max()) <= 1e-5

    with torch.no_grad():
        full = lm(ours.sequences, ours.attention_mask, **vision).logits
        reference = tiny_vl(
            input_ids=ours.sequences,
            attention_mask=ours.attention_mask,
            mm_token_type_ids=(ours.sequences == IMAGE).int(),
            **vision,
        ).logits
    real = ours.attention_mask.bool()
    assert float((full - reference)[real].abs().max()) <= 1e-5


def test_standard_mode_text_lm_matches_transformers_generate(
    tiny_text_lm: Qwen2ForCausalLM,
) -> None:
    lm = NumericLM(tiny_text_lm, None, None)
    ids, mask = left_pad([[BOS, 20, 21, 22, 23], [BOS, 30]])
    ours = lm.generate(ids, mask, max_new_tokens=5, eos_token_id=[])
    theirs = tiny_text_lm.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False
    )
    assert torch.equal(ours.sequences, theirs)


def test_captured_hidden_is_the_final_normed_lm_head_input(
    tiny_vl: Qwen2_5_VLForConditionalGeneration, image: TinyImage
) -> None:
    lm = NumericLM(tiny_vl, make_head("rned_corr"), NUM)
    ids, mask = left_pad(VL_ROWS)
    embeds, positions = lm.prepare_inputs(
        ids, mask, values(PROMPT_VALUES["vl"]), image.pixel_values, image.image_grid_thw
    )
    with torch.no_grad():
        logits, hidden, _ = lm.run_model(embeds, mask, positions)
        states = tiny_vl(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            output_hidden_states=True,
        ).hidden_states
    torch.testing.assert_close(tiny_vl.lm_head(hidden), logits, rtol=0, atol=0)
    # in transformers 5.x the last hidden_states entry is the post-norm state as well
    torch.testing.assert_close(states[-1], hidden, rtol=0, atol=0)
    rms = hidden[mask.bool()].pow(2).mean(-1).sqrt()
    norm_weight = tiny_vl.model.language_model.norm.weight
    # a fresh RMSNorm has unit weight, so its output has unit RMS over the features
    assert float(norm_weight.detach().abs().max()) == pytest.approx(1.0)
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-3)


# --- training ------------------------------------------------------------------------------------


def training_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Question (with an image / a [NUM]) then answer; labels only on the answer."""
    rows = [
        ([BOS, *IMG, 10, NUM, 11], [12, NUM, 13, NUM, EOS]),  # answer values 41.5, 18.0
        ([BOS, 20, 21], [22, NUM, EOS]),  # 250.0
    ]
    prompt_values = [12.5, 41.5, 18.0, 250.0]  # row-major over all [NUM] inputs
    ids, mask = left_pad([q + a for q, a in rows])
    labels = ids.clone()
    for i, (_, answer) in enumerate(rows):
        labels[i, : ids.shape[1] - len(answer)] = -100
    return ids, mask, labels, values(prompt_values)


@pytest.mark.parametrize("kind", [*HEADS, "standard"])
def test_training_loss_and_gradients(
    tiny_vl: Qwen2_5_VLForConditionalGeneration, image: TinyImage, kind: str
) -> None:
    head = None if kind == "standard" else make_head(kind)
    lm = NumericLM(tiny_vl, head, None if head is None else NUM)
    ids, mask, labels, nums = training_batch()
    if head is None:  # standard-token mode has no [NUM] values: keep the ids as plain tokens
        nums = None
    vision = {"pixel_values": image.pixel_values, "image_grid_thw": image.image_grid_thw}
    lm.zero_grad(set_to_none=True)
    try:
        out = lm(ids, mask, nums, labels=labels, lambda_=0.5, **vision)
        assert out.loss is not None and out.ce_loss is not None
        assert bool(torch.isfinite(out.loss))
        out.loss.backward()
        grads = {
            "lm_head": tiny_vl.lm_head.weight.grad,
            "embed_tokens": tiny_vl.model.language_model.embed_tokens.weight.grad,
            "decoder": tiny_vl.model.language_model.layers[0].mlp.up_proj.weight.grad,
            "vision": tiny_vl.model.visual.merger.mlp[0].weight.grad,
        }
        if isinstance(head, torch.nn.Module):
            grads |= {f"head.{n}": p.grad for n, p in head.named_parameters() if p.requires_grad}
        for name, grad in grads.items():
            assert grad is not None and float(grad.abs().sum()) > 0, name
        if head is None:
            assert out.numeric_loss is None
            # equals transformers' own loss on the same batch
            reference = tiny_vl(
                input_ids=ids,
                attention_mask=mask,
                labels=labels,
                mm_token_type_ids=(ids == IMAGE).int(),
                **vision,
            ).loss
            torch.testing.assert_close(out.ce_loss, reference)
        else:
            assert out.numeric_loss is not None and float(out.numeric_loss.detach()) > 0
            torch.testing.assert_close(out.loss, out.ce_loss + 0.5 * out.numeric_loss)
    finally:
        lm.zero_grad(set_to_none=True)


class SpyHead:
    """A real head that records what NumericLM hands it."""

    def __init__(self, inner: NumericHead) -> None:
        self.inner = inner
        self.name = inner.name
        self.loss_calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.decode_sizes: list[int] = []

    def embed(self, values: torch.Tensor) -> torch.Tensor:
        return self.inner.embed(values)

    def loss(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        self.loss_calls.append((hidden.detach(), values))
        return self.inner.loss(hidden, values)

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        self.decode_sizes.append(hidden.shape[0])
        return self.inner.decode(hidden)

    def confidence(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor | None:
        return self.inner.confidence(hidden, values)


def test_numeric_loss_only_at_num_targets(
    tiny_vl: Qwen2_5_VLForConditionalGeneration, image: TinyImage
) -> None:
    spy = SpyHead(make_head("xval"))
    assert isinstance(spy, NumericHead)
    lm = NumericLM(tiny_vl, spy, NUM)
    ids, mask, labels, nums = training_batch()
    vision = {"pixel_values": image.pixel_values, "image_grid_thw": image.image_grid_thw}
    with torch.no_grad():
        out = lm(ids, mask, nums, labels=labels, **vision)
        embeds, positions = lm.prepare_inputs(ids, mask, nums, **vision)
        _, hidden, _ = lm.run_model(embeds, mask, positions)
    # targets: the positions just before the answer [NUM]s; the question's [NUM] is not one
    expected = [[r, c - 1] for r, c in (labels == NUM).nonzero().tolist()]
    assert out.num_positions.tolist() == expected and len(expected) == 3
    assert out.num_targets is not None and out.num_targets.tolist() == [41.5, 18.0, 250.0]
    (seen_hidden, seen_values), *rest = spy.loss_calls
    assert not rest and seen_values.tolist() == [41.5, 18.0, 250.0]
    rows, cols = out.num_positions.unbind(-1)
    torch.testing.assert_close(seen_hidden, hidden[rows, cols].float(), rtol=0, atol=0)
    assert seen_hidden.dtype == torch.float32

    # lambda_ weighs it; without [NUM] targets it is zero
    with torch.no_grad():
        plain = lm(ids, mask, nums, labels=labels, lambda_=0.0, **vision)
        no_num = labels.masked_fill(labels == NUM, -100)
        none = lm(ids, mask, nums, labels=no_num, **vision)
    assert plain.loss is not None and plain.ce_loss is not None
    torch.testing.assert_close(plain.loss, plain.ce_loss)
    assert none.numeric_loss is not None and float(none.numeric_loss) == 0.0
    assert none.num_positions.shape == (0, 2)


def test_label_values_override_and_mismatch(
    tiny_vl: Qwen2_5_VLForConditionalGeneration, image: TinyImage
) -> None:
    lm = NumericLM(tiny_vl, make_head("xval"), NUM)
    ids, mask, labels, nums = training_batch()
    vision = {"pixel_values": image.pixel_values, "image_grid_thw": image.image_grid_thw}
    with torch.no_grad():
        out = lm(ids, mask, nums, labels=labels, label_values=values([1.0, 2.0, 3.0]), **vision)
    assert out.num_targets is not None and out.num_targets.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="label_values"):
        lm(ids, mask, nums, labels=labels, label_values=values([1.0]), **vision)


# --- generation details --------------------------------------------------------------------------


def test_decodes_only_rows_that_emit_num(tiny_text_lm: Qwen2ForCausalLM) -> None:
    spy = SpyHead(make_head("rned_rnd"))
    lm = NumericLM(tiny_text_lm, spy, NUM)
    ids, mask = left_pad(TEXT_ROWS)
    gen = lm.generate(
        ids,
        mask,
        values(PROMPT_VALUES["text"]),
        max_new_tokens=MAX_NEW,
        logits_processor=forcing(ids.shape[1]),
    )
    # one decode call per step with a [NUM], of exactly the rows that emitted it
    per_step = [sum(step in s for s in NUM_STEPS) for step in range(MAX_NEW)]
    assert spy.decode_sizes == [n for n in per_step if n]
    assert gen.logits is None


def test_stops_when_every_row_is_done(tiny_text_lm: Qwen2ForCausalLM) -> None:
    lm = NumericLM(tiny_text_lm, make_head("xval"), NUM)
    ids, mask = left_pad([[BOS, 20, 21], [BOS, 30]])

    def eos_at_step_2(sequences: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if sequences.shape[1] - ids.shape[1] == 2:
            scores[:, EOS] = 1e9
        return scores

    gen = lm.generate(ids, mask, max_new_tokens=20, logits_processor=eos_at_step_2)
    assert gen.new_tokens.shape == (2, 3) and gen.new_tokens[:, -1].eq(EOS).all()
    assert gen.num_values.numel() == sum(len(v) for v in gen.values)


def test_sampling_is_seeded_and_filters() -> None:
    scores = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    assert select_next_token(scores, do_sample=False).tolist() == [3, 0]
    first = select_next_token(
        scores.repeat(50, 1), do_sample=True, generator=torch.Generator().manual_seed(0)
    )
    again = select_next_token(
        scores.repeat(50, 1), do_sample=True, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(first, again)
    top1 = select_next_token(scores, do_sample=True, top_k=1)
    assert top1.tolist() == [3, 0]
    nucleus = select_next_token(scores.repeat(50, 1), do_sample=True, top_p=0.5)
    assert set(nucleus.tolist()) <= {3, 0}  # the top token alone holds > 0.5 of the mass
    with pytest.raises(ValueError, match="temperature"):
        select_next_token(scores, do_sample=True, temperature=0.0)


# --- standard-token mode and errors --------------------------------------------------------------


def test_standard_token_mode_uses_plain_embeddings(
    tiny_vl: Qwen2_5_VLForConditionalGeneration,
) -> None:
    lm = NumericLM(tiny_vl, None, None)
    ids, _ = left_pad(VL_ROWS)
    torch.testing.assert_close(lm.embed_inputs(ids), tiny_vl.get_input_embeddings()(ids))
    with pytest.raises(ValueError, match="no numeric_head"):
        lm.embed_inputs(ids, values([1.0]))


def test_errors_name_the_problem(
    tiny_vl: Qwen2_5_VLForConditionalGeneration,
    tiny_text_lm: Qwen2ForCausalLM,
    image: TinyImage,
) -> None:
    lm = NumericLM(tiny_vl, make_head("xval"), NUM)
    ids, mask = left_pad(VL_ROWS)
    vision = {"pixel_values": image.pixel_values, "image_grid_thw": image.image_grid_thw}
    with pytest.raises(ValueError, match=r"3 \[NUM\] tokens but num_values has 2"):
        lm.generate(ids, mask, values([1.0, 2.0]), max_new_tokens=1, **vision)
    with pytest.raises(ValueError, match="left-padded"):
        lm.generate(ids.flip(1), mask.flip(1), values([1.0, 2.0, 3.0]), max_new_tokens=1, **vision)
    with pytest.raises(ValueError, match="pixel_values is None"):
        lm(ids, mask, values([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="video"):
        lm(ids.masked_fill(ids == IMAGE, VIDEO), mask, values([1.0, 2.0, 3.0]), **vision)
    with pytest.raises(ValueError, match="num_token_id is required"):
        NumericLM(tiny_vl, make_head("xval"), None)
    text = NumericLM(tiny_text_lm, None, None)
    with pytest.raises(ValueError, match="text-only"):
        text(ids, mask, **vision)


# --- the xVal head -------------------------------------------------------------------------------


def test_xval_head() -> None:
    torch.manual_seed(0)
    head = XValHead(8, lo=10.0, hi=30.0)
    assert isinstance(head, NumericHead) and head.name == "xval"
    v = values([10.0, 20.0, 30.0, 40.0])
    assert head.normalise(v).tolist() == [-1.0, 0.0, 1.0, 2.0]
    emb = head.embed(v)  # (4, 8): u(v) * e_num, the norm follows |u|
    assert emb.shape == (4, 8) and emb.dtype == torch.float32
    torch.testing.assert_close(emb[2], head.num_embedding.detach())
    torch.testing.assert_close(emb[1], torch.zeros(8))

    # decode is the raw denormalised prediction: no clamp, out-of-range is flagged by in_range
    with torch.no_grad():
        head.number_head[2].weight.zero_()
        head.number_head[2].bias.fill_(2.0)  # predicts u = 2, i.e. 40 > hi
    decoded = head.decode(torch.randn(3, 8))
    assert decoded.dtype == torch.float64 and decoded.tolist() == [40.0] * 3
    assert head.in_range(decoded).tolist() == [False] * 3
    assert float(head.loss(torch.randn(1, 8), values([40.0])).detach()) == 0.0

    with pytest.raises(ValueError, match="finite"):
        head.embed(values([float("nan")]))
    with pytest.raises(ValueError, match="hidden"):
        head.decode(torch.randn(2, 7))
    with pytest.raises(ValueError, match="lo < hi"):
        XValHead(8, lo=1.0, hi=1.0)


def test_xval_head_learns_a_value() -> None:
    torch.manual_seed(0)
    head = XValHead(8, lo=0.0, hi=100.0)
    hidden = torch.randn(16, 8)
    target = 50.0 + 40.0 * torch.tanh(hidden[:, 0]).double()  # (32,) a function of the state
    optimiser = torch.optim.Adam(head.parameters(), lr=3e-2)
    for _ in range(60):
        optimiser.zero_grad()
        head.loss(hidden, target).backward()
        optimiser.step()
    assert float((head.decode(hidden) - target).abs().mean()) < 2.0


# --- the [NUM] path of the loop ------------------------------------------------------------------


@pytest.mark.parametrize("kind", HEADS)
def test_every_row_emitting_num_at_once(tiny_text_lm: Qwen2ForCausalLM, kind: str) -> None:
    """Steps where every row emits [NUM] (then the loop looks up no token embeddings), with one
    row and with three, match one full forward pass."""
    head = make_head(kind)
    lm = NumericLM(tiny_text_lm, head, NUM)
    for rows in (TEXT_ROWS[:1], TEXT_ROWS[:3]):
        ids, mask = left_pad(rows)

        def process(
            sequences: torch.Tensor, scores: torch.Tensor, p: int = ids.shape[1]
        ) -> torch.Tensor:
            scores[:, [NUM, EOS]] = float("-inf")
            if sequences.shape[1] - p in (0, 2, 3):
                scores[:, NUM] = 1e9
            return scores

        gen = lm.generate(
            ids,
            mask,
            values(PROMPT_VALUES["text"][:2]),
            max_new_tokens=5,
            logits_processor=process,
            output_logits=True,
        )
        assert (
            gen.new_tokens[:, [0, 2, 3]].eq(NUM).all() and gen.new_tokens[:, [1, 4]].ne(NUM).all()
        )
        assert [len(v) for v in gen.values] == [3] * len(rows)
        check_against_full_forward(lm, gen, head)


def test_padding_with_the_num_id_is_not_decoded(tiny_text_lm: Qwen2ForCausalLM) -> None:
    """A finished row feeds pad_id; when pad_id is [NUM]'s id that padding is not a [NUM]."""
    spy = SpyHead(make_head("rned_rnd"))
    lm = NumericLM(tiny_text_lm, spy, NUM)
    ids, mask = left_pad([[BOS, 20, 21], [BOS, 30]])

    def process(sequences: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = sequences.shape[1] - ids.shape[1]
        scores[:, [NUM, EOS]] = float("-inf")
        if step == 0:
            scores[0, EOS] = 1e9  # row 0 stops at once
        if step in (1, 2):
            scores[1, NUM] = 1e9
        return scores

    gen = lm.generate(ids, mask, max_new_tokens=4, pad_token_id=NUM, logits_processor=process)
    assert gen.new_tokens[0].tolist() == [EOS, NUM, NUM, NUM]  # padding, with [NUM]'s id
    assert gen.new_tokens[1, 1:3].tolist() == [NUM, NUM]
    assert spy.decode_sizes == [1, 1]  # row 1 only
    assert [len(v) for v in gen.values] == [0, 2]


# --- the loop's key-value cache and finished rows -------------------------------------------------


def assert_same_generation(ours: NumericGeneration, theirs: NumericGeneration) -> None:
    """Bit for bit: tokens, masks, values, confidences (NaN where the head has none), logits."""
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.attention_mask, theirs.attention_mask)
    for a, b in [
        *zip(ours.values, theirs.values, strict=True),
        *zip(ours.confidences, theirs.confidences, strict=True),
        (ours.num_values, theirs.num_values),
    ]:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    for a, b in ((ours.logits, theirs.logits), (ours.first_logits, theirs.first_logits)):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert torch.equal(a, b)


@pytest.mark.parametrize("kind", HEADS)
def test_the_preallocated_cache_gives_the_growing_caches_results_bit_for_bit(
    tiny_vl: Qwen2_5_VLForConditionalGeneration,
    image: TinyImage,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lm = NumericLM(tiny_vl, make_head(kind), NUM)
    ids, mask = left_pad(VL_ROWS)
    cache = lm.generation_cache(ids.shape[1] + MAX_NEW)
    assert cache is not None and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)

    def run() -> NumericGeneration:
        return lm.generate(
            ids,
            mask,
            values(PROMPT_VALUES["vl"]),
            max_new_tokens=MAX_NEW,
            logits_processor=forcing(ids.shape[1]),
            output_logits=True,
            pixel_values=image.pixel_values,
            image_grid_thw=image.image_grid_thw,
        )

    ours = run()
    monkeypatch.setattr(lm, "generation_cache", lambda capacity: None)  # transformers' own cache
    assert_same_generation(ours, run())
    # a cache too small for the call grows, with the same results
    layers = tiny_vl.config.get_text_config().num_hidden_layers
    monkeypatch.setattr(lm, "generation_cache", lambda capacity: preallocated_cache(layers, 3))
    assert_same_generation(ours, run())
    with pytest.raises(ValueError, match="capacity"):
        PreallocatedLayer(0)


def test_finished_rows_leave_the_batch_with_the_same_answers(
    tiny_text_lm: Qwen2ForCausalLM,
) -> None:
    lm = NumericLM(tiny_text_lm, make_head("rned_corr"), NUM)
    ids, mask = left_pad(TEXT_ROWS)
    prompt_values = values(PROMPT_VALUES["text"])
    probe = lm.generate(ids, mask, prompt_values, max_new_tokens=MAX_NEW, eos_token_id=[])
    # the end token: the one row 0 says at step 1; rows then finish at different steps
    end = int(probe.new_tokens[0, 1])
    first = [
        next((s for s, t in enumerate(row.tolist()) if t == end), MAX_NEW)
        for row in probe.new_tokens
    ]
    assert first[0] == 1 and max(first) > 2, f"rows end at {first}: pick another end token"

    rows_seen: list[int] = []
    hook = tiny_text_lm.register_forward_pre_hook(
        lambda _, args, kwargs: rows_seen.append(kwargs["inputs_embeds"].shape[0]),
        with_kwargs=True,
    )
    try:
        leaving = lm.generate(ids, mask, prompt_values, max_new_tokens=MAX_NEW, eos_token_id=end)
        seen_leaving = list(rows_seen)
        rows_seen.clear()
        # a logits processor keeps every row in the batch (it sees them all, row by row)
        staying = lm.generate(
            ids,
            mask,
            prompt_values,
            max_new_tokens=MAX_NEW,
            eos_token_id=end,
            logits_processor=lambda _, scores: scores,
        )
    finally:
        hook.remove()
    assert rows_seen == [len(TEXT_ROWS)] * len(rows_seen)
    assert seen_leaving[0] == len(TEXT_ROWS) and seen_leaving[-1] < len(TEXT_ROWS)
    assert sum(seen_leaving) < sum(rows_seen)
    # tokens and values bit for bit; confidences to float32 rounding (a smaller batch may sum
    # in another order)
    assert torch.equal(leaving.sequences, staying.sequences)
    assert torch.equal(leaving.attention_mask, staying.attention_mask)
    for a, b in zip(leaving.values, staying.values, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(leaving.confidences, staying.confidences, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_an_automaton_ends_answers_that_cannot_parse(tiny_text_lm: Qwen2ForCausalLM) -> None:
    lm = NumericLM(tiny_text_lm, make_head("rned_corr"), NUM)
    ids, mask = left_pad(TEXT_ROWS)
    prompt_values = values(PROMPT_VALUES["text"])
    free = lm.generate(ids, mask, prompt_values, max_new_tokens=MAX_NEW, eos_token_id=[])
    # any first token is fine; a second token is only fine for row 0's own second token
    table = torch.full((3, VOCAB), -1, dtype=torch.long)
    table[0] = 1
    table[1, int(free.new_tokens[0, 1])] = 2
    table[2] = 2
    automaton = TokenAutomaton(table, torch.tensor([0, 0, 0]))
    ended = lm.generate(
        ids, mask, prompt_values, max_new_tokens=MAX_NEW, eos_token_id=[], automaton=automaton
    )
    new_mask = ended.attention_mask[:, ended.prompt_length :]
    lengths = new_mask.sum(dim=1).tolist()
    stays = [int(free.new_tokens[r, 1]) == int(free.new_tokens[0, 1]) for r in range(len(ids))]
    assert stays[0] and not all(stays)
    assert lengths == [MAX_NEW if ok else 2 for ok in stays]
    # the tokens up to each row's end are the free run's
    for row, length in enumerate(lengths):
        assert torch.equal(ended.new_tokens[row, :length], free.new_tokens[row, :length])
    # too few tokens left to reach the end stops a row as well
    table[2] = 2
    tight = TokenAutomaton(table, torch.tensor([0, 0, MAX_NEW]))
    short = lm.generate(
        ids, mask, prompt_values, max_new_tokens=MAX_NEW, eos_token_id=[], automaton=tight
    )
    assert short.attention_mask[:, short.prompt_length :].sum(dim=1).tolist() == [2] * len(ids)
