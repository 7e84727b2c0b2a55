"""The default model's own tokenizer: a fixed word-level vocabulary for the task language.

Built with the ``tokenizers`` library and wrapped as ``transformers.PreTrainedTokenizerFast``, so
it saves with ``save_pretrained(dir)`` and loads with ``from_pretrained(dir)`` (or
:func:`load_tokenizer`) without any download. Special tokens carry Qwen2.5-VL's names.

Vocabulary (:data:`VOCAB`, ids fixed, size 54)
-----------------------------------------------
==========  =====================================================================
ids         tokens
==========  =====================================================================
0, 1, 2     ``<|endoftext|>`` (pad), ``<|im_start|>`` (bos), ``<|im_end|>`` (eos)
3, 4        ``[NUM]`` (one number, RNED), ``[UNK]`` (anything outside the vocabulary)
5-14        the digits ``0`` ... ``9``
15-24       ``.`` ``,`` ``;`` ``:`` ``[`` ``]`` ``(`` ``)`` ``x`` ``-``
25-49       the words of the task language (``model.measurer.tasks.text``) and a few reserved
            measurement words (``axis``, ``by``, ``diameter``, ``findings``, ``long``, ``of``,
            ``short``), alphabetically
50-53       ``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``
==========  =====================================================================

The vision tokens are the last four ids, which is what
``model.backbone.tiny_qwen2_5_vl_kwargs(vocab_size=len(VOCAB))`` assumes; :func:`special_ids`
gives all the ids by name. Changing :data:`VOCAB` changes ids and so invalidates trained models.

Encoding
--------
Special tokens and ``[NUM]`` are matched whole, case-sensitively, before anything else. The rest
is lowercased, split on whitespace, each punctuation character is split off, and every digit is
its own token (as in Qwen): ``"32.5 x 18 mm"`` -> ``3 2 . 5 x 1 8 mm`` and ``"32x18mm"`` gives
the same tokens. A piece outside the vocabulary (``"aorta"``, ``"×"``) is one ``[UNK]``.
``encode`` adds no bos / eos: the caller assembling the model input places them.

Decoding
--------
``tokenizer.decode`` needs no helper: the decoder stored in ``tokenizer.json`` joins tokens with
single spaces, then glues digits to digits, a ``.`` between digits to both, ``[`` and ``(`` to
what follows, ``]`` ``)`` ``,`` ``.`` ``:`` to what precedes and a ``-`` to a following number.
Every text of the task language thus round-trips exactly (``"[12, 40, 88, 101]"``,
``"[[NUM], [NUM], [NUM], [NUM]]"``, ``"lesion 32.5 x 18 mm"``). What the tokens do not hold
comes back canonical: case, newlines, spacing around punctuation, and the space between two
numbers written side by side (``"3 5"`` decodes as ``"35"``; the task language never does that).
Leave ``clean_up_tokenization_spaces`` off (the default of these tokenizers).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from model.numeric.text import NUM_TOKEN

__all__ = [
    "BOS",
    "EOS",
    "IMAGE_PAD",
    "NUM",
    "PAD",
    "QWEN_CHAT_TEMPLATE",
    "UNK",
    "VIDEO_PAD",
    "VISION_END",
    "VISION_START",
    "VOCAB",
    "build_tokenizer",
    "chat_prompt",
    "load_tokenizer",
    "special_ids",
]

PAD = "<|endoftext|>"
BOS = "<|im_start|>"
EOS = "<|im_end|>"
NUM = NUM_TOKEN
UNK = "[UNK]"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"

_DIGITS = tuple("0123456789")
_PUNCTUATION = (".", ",", ";", ":", "[", "]", "(", ")", "x", "-")
_TASK_WORDS = (
    "and", "at", "box", "end", "find", "image", "images", "in", "lesion", "lesions", "measure",
    "mm", "none", "point", "slice", "the", "vessel", "vessels",
)  # fmt: skip
_RESERVED_WORDS = ("axis", "by", "diameter", "findings", "long", "of", "short")
_VISION = (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)

VOCAB: tuple[str, ...] = (
    *(PAD, BOS, EOS, NUM, UNK),
    *_DIGITS,
    *_PUNCTUATION,
    *sorted(_TASK_WORDS + _RESERVED_WORDS),
    *_VISION,
)
"""Every token, at its id."""

_SPECIAL_IDS = {
    "bos": BOS,
    "eos": EOS,
    "pad": PAD,
    "image": IMAGE_PAD,
    "video": VIDEO_PAD,
    "vision_start": VISION_START,
    "vision_end": VISION_END,
    "num": NUM,
}

# (pattern, replacement) applied in order to the space-joined tokens; see "Decoding" above
_GLUE = (
    (r"(?<=[0-9]) (?=[0-9])", ""),  # 3 2 -> 32
    (r"(?<=[0-9]) \. (?=[0-9])", "."),  # 32 . 5 -> 32.5
    (r"(?<=[\[(]) ", ""),  # [ 12 -> [12
    (r" (?=[\]),.:])", ""),  # 101 ] -> 101], 12 , -> 12,
    (r"(?<=-) (?=[0-9]|\[NUM\])", ""),  # - 3 -> -3
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The default model's tokenizer over :data:`VOCAB`; every call gives the same ids.

    >>> tokenizer = build_tokenizer()
    >>> tokenizer.convert_ids_to_tokens(tokenizer.encode("[NUM] x 18 mm"))
    ['[NUM]', 'x', '1', '8', 'mm']
    """
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation("isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.WordPiece(prefix="##", cleanup=False),  # joins with spaces; no ## tokens
            decoders.Fuse(),
            *(decoders.Replace(Regex(pattern), by) for pattern, by in _GLUE),
        ]
    )
    specials = (PAD, BOS, EOS, UNK, *_VISION)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    # [NUM] is kept whole but is not "special": decode(skip_special_tokens=True) keeps it
    backend.add_tokens([AddedToken(NUM, normalized=False, special=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        image_token=IMAGE_PAD,
        video_token=VIDEO_PAD,
        vision_start_token=VISION_START,
        vision_end_token=VISION_END,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(directory: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """A tokenizer saved with ``save_pretrained(directory)``, read locally (never downloaded)."""
    path = Path(directory)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(
            f"no tokenizer.json in {str(path)!r}; save one there first, e.g. "
            "build_tokenizer().save_pretrained(directory)"
        )
    tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(
        path, local_files_only=True
    )
    return tokenizer


def special_ids(tokenizer: PreTrainedTokenizerBase, *, with_num: bool = True) -> dict[str, int]:
    """Ids of the special tokens by role: the keys of ``tiny_qwen2_5_vl_kwargs(special_ids=)``.

    Keys: ``bos``, ``eos``, ``pad``, ``image``, ``video``, ``vision_start``, ``vision_end`` and,
    ``with_num``, ``num`` (the ``[NUM]`` token, ``NumericLM``'s ``num_token_id``; a released
    Qwen tokenizer has none until ``load_base_model`` adds it). Raises ``ValueError`` naming the
    tokens a tokenizer lacks.
    """
    roles = {r: t for r, t in _SPECIAL_IDS.items() if with_num or r != "num"}
    vocab = tokenizer.get_vocab()
    missing = [token for token in roles.values() if token not in vocab]
    if missing:
        raise ValueError(
            f"tokenizer lacks the tokens {missing}; use build_tokenizer(), or add them to the "
            "tokenizer (and resize the model's embeddings) first"
        )
    return {role: int(vocab[token]) for role, token in roles.items()}


QWEN_CHAT_TEMPLATE = (  # no whitespace control: every character outside the tags is output
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2.5-VL's chat format (system turn, user turn with the image first, assistant turn),
for stand-in tokenizers that carry no template of their own; a released Qwen tokenizer brings
its own (``tokenizer_config.json``)."""


def chat_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str | None:
    """The text of one user turn (the image, then ``prompt``) and the opening of the
    assistant's, in the tokenizer's chat template; None for a tokenizer without one (the
    default model's: its prompts are the bare layout of ``model.measurer.inputs.data``)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    message: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": prompt}],
    }
    render: Any = tokenizer.apply_chat_template
    text = render([message], tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str) or text.count(IMAGE_PAD) != 1:
        raise ValueError(
            f"the tokenizer's chat template must render one image as one {IMAGE_PAD}; got {text!r}"
        )
    return text
