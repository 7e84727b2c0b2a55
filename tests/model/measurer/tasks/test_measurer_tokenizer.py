"""The default model's tokenizer: fixed ids, [NUM] whole, digits split, decode, save and load."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from model.backbone import tiny_qwen2_5_vl_kwargs
from model.measurer.tasks.tokenizer import (
    BOS,
    EOS,
    IMAGE_PAD,
    NUM,
    PAD,
    UNK,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VOCAB,
    build_tokenizer,
    load_tokenizer,
    special_ids,
)

TEXTS = [
    "find lesions and vessels in the images",
    "lesion slice 3 box [12, 40, 88, 101] ; vessel slice 15 box [0.5, 1, 299.9, 300] ; end",
    "lesion slice [NUM] box [[NUM], [NUM], [NUM], [NUM]] ; end",
    "measure the lesion",
    "32.5 x 18 mm",
    "[NUM] x [NUM] mm",
    "vessel 31 mm",
    "measure at the point",
    "none",
    "-3 (x): end.",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def tokens(tokenizer: PreTrainedTokenizerFast, text: str) -> list[str]:
    return list(tokenizer.convert_ids_to_tokens(tokenizer.encode(text)))


def test_vocabulary_is_small_fixed_and_in_order(tokenizer: PreTrainedTokenizerFast) -> None:
    assert len(VOCAB) == len(set(VOCAB)) == len(tokenizer) == 54 < 100
    assert tokenizer.get_vocab() == {token: i for i, token in enumerate(VOCAB)}
    assert build_tokenizer().get_vocab() == tokenizer.get_vocab()
    assert VOCAB[:5] == (PAD, BOS, EOS, NUM, UNK)
    assert VOCAB[:5] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[NUM]", "[UNK]")
    assert VOCAB[5:15] == tuple("0123456789")
    assert VOCAB[-4:] == (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)
    assert VOCAB[-4:] == ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def test_special_ids_match_the_tiny_backbone_defaults(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = special_ids(tokenizer)
    size = len(tokenizer)
    assert ids == {
        "bos": 1,
        "eos": 2,
        "pad": 0,
        "image": size - 4,
        "video": size - 3,
        "vision_start": size - 2,
        "vision_end": size - 1,
        "num": 3,
    }
    defaults = tiny_qwen2_5_vl_kwargs(vocab_size=size)
    explicit = tiny_qwen2_5_vl_kwargs(vocab_size=size, special_ids=ids)
    for kwargs in (defaults, explicit):
        assert kwargs["image_token_id"] == ids["image"]
        assert kwargs["video_token_id"] == ids["video"]
        assert kwargs["vision_start_token_id"] == ids["vision_start"]
        assert kwargs["vision_end_token_id"] == ids["vision_end"]
        text = kwargs["text_config"]
        assert (text["bos_token_id"], text["eos_token_id"], text["pad_token_id"]) == (1, 2, 0)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    assert tokenizer.unk_token_id == 4
    assert tokenizer.image_token_id == ids["image"]
    assert tokenizer.vision_end_token_id == ids["vision_end"]


def test_special_ids_names_missing_tokens() -> None:
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    bare = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    with pytest.raises(ValueError, match=r"lacks the tokens.*\[NUM\].*build_tokenizer"):
        special_ids(bare)


def test_num_is_one_token_and_digits_split(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokens(tokenizer, "[NUM]") == ["[NUM]"]
    assert tokens(tokenizer, "[[NUM], [NUM]]") == ["[", "[NUM]", ",", "[NUM]", "]"]
    assert tokens(tokenizer, "[num]") == ["[", "[UNK]", "]"]  # [NUM] is case-sensitive
    assert tokens(tokenizer, "32.5") == ["3", "2", ".", "5"]
    assert tokens(tokenizer, "32.5 x 18 mm") == ["3", "2", ".", "5", "x", "1", "8", "mm"]
    assert tokens(tokenizer, "32.5x18MM") == tokens(tokenizer, "32.5 x 18 mm")
    assert tokens(tokenizer, "[12,40]") == ["[", "1", "2", ",", "4", "0", "]"]


def test_special_tokens_stay_whole(tokenizer: PreTrainedTokenizerFast) -> None:
    text = f"{BOS}{VISION_START}{IMAGE_PAD}{IMAGE_PAD}{VISION_END}find{EOS}{PAD}"
    assert tokens(tokenizer, text) == [
        BOS, VISION_START, IMAGE_PAD, IMAGE_PAD, VISION_END, "find", EOS, PAD
    ]  # fmt: skip
    assert tokenizer.encode("find") == [VOCAB.index("find")]  # no bos / eos added


def test_unknown_words_and_symbols_are_unk(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokens(tokenizer, "aorta") == [UNK]
    assert tokens(tokenizer, "Measure the AORTA") == ["measure", "the", UNK]
    assert tokens(tokenizer, "32×18") == ["3", "2", UNK, "1", "8"]
    assert tokens(tokenizer, "T12") == [UNK, "1", "2"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips_canonical_texts(tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = tokenizer.encode(text)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_decode_can_skip_special_tokens_but_keeps_num(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode(f"{VISION_START}{IMAGE_PAD}{VISION_END}[NUM] x [NUM] mm{EOS}")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "[NUM] x [NUM] mm"
    assert tokenizer.decode(ids).startswith(f"{VISION_START} {IMAGE_PAD} {VISION_END} [NUM]")


def test_decode_loses_only_what_the_tokens_do_not_hold(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    assert tokenizer.decode(tokenizer.encode("Lesion\n32x18MM")) == "lesion 32 x 18 mm"
    assert tokenizer.decode(tokenizer.encode("3 5")) == "35"  # never written by the task language


@given(st.lists(st.integers(0, len(VOCAB) - 1), max_size=40))
def test_encode_of_decode_gives_the_same_ids(
    tokenizer: PreTrainedTokenizerFast, ids: list[int]
) -> None:
    assert tokenizer.encode(tokenizer.decode(ids)) == ids


def test_save_and_load_round_trip(tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    tokenizer.save_pretrained(tmp_path)
    for loaded in (
        load_tokenizer(tmp_path),
        PreTrainedTokenizerFast.from_pretrained(tmp_path, local_files_only=True),
    ):
        assert loaded.get_vocab() == tokenizer.get_vocab()
        assert special_ids(loaded) == special_ids(tokenizer)
        assert loaded.unk_token_id == tokenizer.unk_token_id
        for text in TEXTS:
            ids = loaded.encode(text)
            assert ids == tokenizer.encode(text)
            assert loaded.decode(ids) == text


def test_load_tokenizer_names_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json in .*save_pretrained"):
        load_tokenizer(tmp_path / "absent")
