"""The find answer's token automaton: it stops exactly the answers that can no longer parse."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from model.measurer.tasks.grammar import find_answer_automaton
from model.measurer.tasks.text import parse_find, with_values
from model.measurer.tasks.tokenizer import build_tokenizer, special_ids
from model.numeric.generation import TokenAutomaton

LIMIT = 80


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="module")
def automaton(tokenizer: PreTrainedTokenizerFast) -> TokenAutomaton:
    made = find_answer_automaton(tokenizer, len(tokenizer), [special_ids(tokenizer)["eos"]])
    assert made is not None
    return made


def stops_at(automaton: TokenAutomaton, ids: list[int], limit: int = LIMIT) -> int | None:
    """The step at which generation would stop the answer (the loop's rule), or None."""
    state = automaton.start
    for step, token in enumerate(ids):
        state = int(automaton.table[state, token])
        if state < 0 or int(automaton.to_end[state]) > limit - step - 1:
            return step
    return None


def encode(tokenizer: PreTrainedTokenizerFast, text: str, *, end: bool = True) -> list[int]:
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    return ids + ([special_ids(tokenizer)["eos"]] if end else [])


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_a_well_formed_answer_runs_to_its_end(
    tokenizer: PreTrainedTokenizerFast, automaton: TokenAutomaton, count: int
) -> None:
    kinds = ["lesion", "vessel", "lesion"][:count]
    items = [f"{kind} box [[NUM], [NUM], [NUM], [NUM]]" for kind in kinds]
    text = " ; ".join([*items, "end"]) if items else "none"
    values = [v for i in range(count) for v in (10 + i, 20, 30 + i, 44)]
    assert parse_find(with_values(text, values), num_images=1).success
    assert stops_at(automaton, encode(tokenizer, text)) is None


@pytest.mark.parametrize(
    "text, bad",
    [
        ("lesion box box", 2),  # a second "box"
        ("none ;", 1),  # anything after "none" but the end
        ("lesion box [ [NUM] , [NUM] , [NUM] ] ;", 8),  # three corners
        ("lesion box [ [NUM] , [NUM] , [NUM] , [NUM] ] ; end ;", 13),  # text after "end"
        ("box", 0),  # no kind
    ],
)
def test_an_answer_stops_at_its_first_token_off_the_grammar(
    tokenizer: PreTrainedTokenizerFast, automaton: TokenAutomaton, text: str, bad: int
) -> None:
    ids = encode(tokenizer, text, end=False)
    assert stops_at(automaton, ids) == bad
    # and the parser agrees the answer is malformed whatever follows
    assert not parse_find(tokenizer.decode(ids[: bad + 1]) + " ; end", num_images=1).success


def test_an_answer_that_cannot_close_in_its_tokens_stops(
    tokenizer: PreTrainedTokenizerFast, automaton: TokenAutomaton
) -> None:
    finding = encode(tokenizer, "lesion box [ [NUM] , [NUM] , [NUM] , [NUM] ] ;", end=False)
    assert len(finding) == 12
    # two findings in 26 tokens fit ("end" and the end token after them); in 25 they do not
    assert stops_at(automaton, finding * 2 + encode(tokenizer, "end"), limit=26) is None
    assert stops_at(automaton, finding * 2, limit=25) == 12  # the second finding's kind


def test_no_automaton_where_a_word_is_several_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    class Split:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [1, 2] if text == "vessel" else [5]

    assert find_answer_automaton(Split(), 50, [2]) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start state"):
        TokenAutomaton(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), 5)
