"""The one-image find answer as a token automaton, so that generation stops an answer as soon as
it can no longer parse (``model.numeric.generation.TokenAutomaton``).

With numbers as [NUM] tokens and a tokenizer that keeps each word of the task language whole
(the measurer's own), a find answer is, token by token::

    none EOS  |  (KIND box [ NUM , NUM , NUM , NUM ] ;)+ end EOS

which is what :func:`model.measurer.tasks.text.parse_find` accepts for one image, less the checks on
the values (a box's corners, the value range), which only the parser makes. A token off this
path, or too few tokens left to close the answer, makes the answer malformed whatever follows,
so the row stops there instead of running to its token limit. Where a word is several tokens
(a subword tokenizer) or numbers are digits, there is no automaton and answers run as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from model.measurer.results import FindingKind
from model.measurer.tasks.text import NONE_WORD
from model.numeric.generation import TokenAutomaton

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["find_answer_automaton"]

_NUM = "[NUM]"


def find_answer_automaton(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, end_ids: Sequence[int]
) -> TokenAutomaton | None:
    """The automaton of a one-image find answer with [NUM] numbers (module doc), or None where
    a word of it is not one token of ``tokenizer``."""
    words = [kind.value for kind in FindingKind]
    words += ["box", "[", "]", ",", ";", "end", NONE_WORD, _NUM]
    ids: dict[str, int] = {}
    for word in words:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) != 1 or not 0 <= encoded[0] < vocab_size:
            return None
        ids[word] = int(encoded[0])
    kinds = [ids[kind.value] for kind in FindingKind]
    box = ["box", "[", _NUM, ",", _NUM, ",", _NUM, ",", _NUM, "]", ";"]
    # states: 0 start; 1..11 inside a finding after its kind (expecting box[i-1]); 12 after a
    # finding's ";"; 13 after "end" or "none"; 14 finished (after the end token)
    table = torch.full((15, vocab_size), -1, dtype=torch.long)
    start, after_item, closing, done = 0, 12, 13, 14
    for state in (start, after_item):
        table[state, kinds] = 1
    for i, word in enumerate(box, start=1):
        table[i, ids[word]] = i + 1 if i < len(box) else after_item
    table[start, ids[NONE_WORD]] = closing
    table[after_item, ids["end"]] = closing
    table[closing, list(end_ids)] = done
    table[done] = done  # finished: padding and anything after stay finished
    # the fewest tokens to the end: "none" EOS from the start; the rest of a finding, then
    # "end" EOS, inside one
    to_end = torch.tensor([2] + [len(box) - i + 3 for i in range(1, len(box) + 1)] + [2, 1, 0])
    return TokenAutomaton(table, to_end, start)
