"""The task language: templates, round trips through the tokenizer, RNED [NUM] texts, parsers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from model.measurer.results import FindingKind
from model.measurer.tasks.text import (
    FoundFinding,
    MeasureAnswer,
    ParsedFind,
    ParsedMeasure,
    ParsedPoint,
    find_answer,
    find_prompt,
    measure_answer,
    measure_prompt,
    parse_find,
    parse_measure,
    parse_point,
    point_answer,
    point_prompt,
    with_values,
)
from model.measurer.tasks.tokenizer import VOCAB, build_tokenizer
from model.numeric.text import NUM_TOKEN, to_num_text

LESION, VESSEL = FindingKind.LESION, FindingKind.VESSEL

# --- strategies --------------------------------------------------------------------------------


def grid(lo: int, hi: int) -> st.SearchStrategy[float]:
    """Values ``index / 10`` on the 0.1 grid with ``lo <= index <= hi``."""
    return st.integers(lo, hi).map(lambda i: i / 10)


@st.composite
def boxes(draw: st.DrawFn) -> tuple[float, float, float, float]:
    row0, row1 = sorted(draw(st.lists(grid(0, 3000), min_size=2, max_size=2, unique=True)))
    col0, col1 = sorted(draw(st.lists(grid(0, 3000), min_size=2, max_size=2, unique=True)))
    return row0, col0, row1, col1


FINDINGS = st.builds(FoundFinding, st.sampled_from(FindingKind), st.integers(0, 63), boxes())


@st.composite
def measurements(draw: st.DrawFn) -> tuple[FindingKind, tuple[float, ...]]:
    kind = draw(st.sampled_from(FindingKind))
    if kind is VESSEL:
        return kind, (draw(grid(10, 3000)),)
    long_mm, short_mm = sorted(draw(st.lists(grid(10, 3000), min_size=2, max_size=2)))[::-1]
    return kind, (long_mm, short_mm)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def through_tokens(tokenizer: PreTrainedTokenizerFast, text: str) -> str:
    """``text`` encoded and decoded, checking that every piece is in the vocabulary."""
    ids = tokenizer.encode(text)
    assert tokenizer.unk_token_id not in ids, tokenizer.convert_ids_to_tokens(ids)
    decoded: str = tokenizer.decode(ids)
    return decoded


def numbers_of(findings: list[FoundFinding]) -> tuple[float, ...]:
    return tuple(v for f in findings for v in (float(f.slice_index), *f.box))


# --- templates ---------------------------------------------------------------------------------


def test_example_texts() -> None:
    findings = [
        FoundFinding(LESION, 3, (12, 40, 88, 101)),
        FoundFinding(VESSEL, 5, (60, 20.04, 90.45, 52)),
    ]
    assert find_prompt(1) == "find lesions and vessels in the image"
    assert find_prompt(8) == "find lesions and vessels in the images"
    assert find_answer(findings) == (
        "lesion slice 3 box [12, 40, 88, 101] ; vessel slice 5 box [60, 20, 90.5, 52] ; end"
    )
    assert find_answer([]) == "none"
    assert measure_prompt(LESION) == "measure the lesion"
    assert measure_prompt("vessel") == "measure the vessel"
    assert measure_answer(LESION, (32.5, 18.0)) == "32.5 x 18 mm"
    assert measure_answer("vessel", [31]) == "31 mm"
    assert point_prompt() == "measure at the point"
    assert point_answer(LESION, (32.5, 18)) == "lesion 32.5 x 18 mm"
    assert point_answer("vessel", (31.04,)) == "vessel 31 mm"
    assert point_answer(None) == "none"


@pytest.mark.parametrize(
    "prompt",
    [
        find_prompt(1),
        find_prompt(3),
        measure_prompt(LESION),
        measure_prompt(VESSEL),
        point_prompt(),
    ],
)
def test_prompts_are_in_the_vocabulary_and_hold_no_number(
    tokenizer: PreTrainedTokenizerFast, prompt: str
) -> None:
    assert through_tokens(tokenizer, prompt) == prompt
    assert to_num_text(prompt).values == ()


def test_every_task_word_is_in_the_vocabulary() -> None:
    texts = [
        find_prompt(1),
        find_prompt(2),
        find_answer([FoundFinding(LESION, 0, (0, 0, 1, 1)), FoundFinding(VESSEL, 1, (0, 0, 1, 1))]),
        find_answer([]),
        *(measure_prompt(kind) for kind in FindingKind),
        point_prompt(),
        point_answer(LESION, (2, 1)),
        point_answer(VESSEL, (1,)),
    ]
    words = {w for text in texts for w in text.replace("[", " ").replace("]", " ").split()}
    words = {w.strip(",") for w in words} - {""}
    assert {w for w in words if not w[0].isdigit()} <= set(VOCAB)


# --- round trips -------------------------------------------------------------------------------


@given(st.lists(FINDINGS, max_size=6))
def test_find_round_trip_standard_tokens(
    tokenizer: PreTrainedTokenizerFast, findings: list[FoundFinding]
) -> None:
    text = find_answer(findings)
    decoded = through_tokens(tokenizer, text)
    assert decoded == text
    parsed = parse_find(decoded, num_images=64)
    assert parsed == ParsedFind(tuple(findings), True)


@given(st.lists(FINDINGS, max_size=6))
def test_find_round_trip_num_tokens(
    tokenizer: PreTrainedTokenizerFast, findings: list[FoundFinding]
) -> None:
    num_text = to_num_text(find_answer(findings))
    assert num_text.text.count(NUM_TOKEN) == 5 * len(findings)
    assert num_text.values == numbers_of(findings)
    assert tokenizer.encode(num_text.text).count(tokenizer.convert_tokens_to_ids(NUM_TOKEN)) == (
        5 * len(findings)
    )
    decoded = through_tokens(tokenizer, num_text.text)
    assert decoded == num_text.text
    assert parse_find(with_values(decoded, num_text.values)).findings == tuple(findings)


@given(measurements())
def test_measure_and_point_round_trips(
    tokenizer: PreTrainedTokenizerFast, measurement: tuple[FindingKind, tuple[float, ...]]
) -> None:
    kind, values = measurement
    for text in (measure_answer(kind, values), point_answer(kind, values)):
        assert through_tokens(tokenizer, text) == text
        num_text = to_num_text(text)
        assert num_text.values == values
        assert num_text.text.count(NUM_TOKEN) == len(values)
        assert through_tokens(tokenizer, num_text.text) == num_text.text
        assert with_values(num_text.text, num_text.values) == text
    plain = measure_answer(kind, values)
    assert parse_measure(plain, kind) == ParsedMeasure(values, True)
    num_text = to_num_text(plain)
    assert parse_measure(with_values(num_text.text, num_text.values), kind).values == values
    point = point_answer(kind, values)
    assert parse_point(through_tokens(tokenizer, point)) == ParsedPoint(kind, values, True)


def test_none_round_trips(tokenizer: PreTrainedTokenizerFast) -> None:
    assert parse_find(through_tokens(tokenizer, find_answer([]))) == ParsedFind((), True)
    assert parse_point(through_tokens(tokenizer, point_answer(None))) == ParsedPoint(None, (), True)


def test_with_values_snaps_decoded_values() -> None:
    text = with_values(
        "lesion slice [NUM] box [[NUM], [NUM], [NUM], [NUM]] ; end", [2.97, 1, 2, 3, 4.04]
    )
    assert text == "lesion slice 3 box [1, 2, 3, 4] ; end"
    with pytest.raises(ValueError, match="give one value per token"):
        with_values("[NUM] x [NUM] mm", [3.0])


# --- writers refuse what their parsers would reject --------------------------------------------


@pytest.mark.parametrize(
    ("kind", "values", "match"),
    [
        (LESION, (18.0, 32.5), "long axis 18.0 is shorter than short axis 32.5"),
        (LESION, (32.5,), r"a lesion measurement has 2 value\(s\), got 1"),
        (VESSEL, (31.0, 2.0), r"pass \(diameter,\)"),
        (VESSEL, (-1.0,), "not a finite length >= 0"),
        (VESSEL, (math.nan,), "not a finite length >= 0"),
        ("tumor", (1.0,), "unknown finding kind 'tumor'; use one of lesion, vessel"),
        (VESSEL, (3000.1,), r"measured value \(mm\) 3000.1 is above 3000"),
    ],
)
def test_measure_answer_refuses_bad_values(
    kind: FindingKind | str, values: tuple[float, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        measure_answer(kind, values)


def test_point_answer_none_takes_no_values() -> None:
    with pytest.raises(ValueError, match="'none' point answer states no values"):
        point_answer(None, (3.0,))


@pytest.mark.parametrize("num_images", [0, -1, True, 2.0])
def test_find_prompt_needs_a_positive_count(num_images: int) -> None:
    with pytest.raises(ValueError, match="num_images must be a positive int"):
        find_prompt(num_images)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((LESION, -1, (0, 0, 1, 1)), "slice_index must be an int >= 0"),
        ((LESION, 1.0, (0, 0, 1, 1)), "slice_index must be an int >= 0"),
        ((LESION, True, (0, 0, 1, 1)), "slice_index must be an int >= 0"),
        ((LESION, 1, (0, 0, 1)), "box must be 4 finite pixel coordinates"),
        ((LESION, 1, (0, 0, 1, math.inf)), "box must be 4 finite pixel coordinates"),
        ((LESION, 1, (0, -1, 1, 1)), "box must be 4 finite pixel coordinates"),
        ((LESION, 1, (5, 0, 1, 1)), "needs row0 < row1 and col0 < col1"),
        ((LESION, 1, (0, 2, 1, 2)), "needs row0 < row1 and col0 < col1"),
        (("organ", 1, (0, 0, 1, 1)), "unknown finding kind 'organ'"),
    ],
)
def test_found_finding_is_valid_from_construction(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FoundFinding(*args)  # type: ignore[arg-type]


def test_found_finding_normalises_its_fields() -> None:
    finding = FoundFinding("vessel", 2, [1, 2, 3, 4])  # type: ignore[arg-type]
    assert finding.kind is VESSEL
    assert finding.box == (1.0, 2.0, 3.0, 4.0)
    assert MeasureAnswer("lesion", (3, 2)).values == (3.0, 2.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("finding", "match"),
    [
        (FoundFinding(LESION, 0, (1.01, 0, 1.04, 2)), "row0 >= row1"),  # collapses on the grid
        (FoundFinding(LESION, 3001, (0, 0, 1, 1)), "slice: value 3001 outside"),
        (FoundFinding(LESION, 0, (0, 0, 1, 3500)), "box coordinate 3500 is above 3000"),
    ],
)
def test_find_answer_refuses_what_would_not_parse(finding: FoundFinding, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        find_answer([finding])


# --- parsers: malformed output is reported, never patched --------------------------------------

GOOD = "lesion slice 3 box [12, 40, 88, 101]"

BAD_FIND = [
    ("", "empty answer"),
    ("   ", "empty answer"),
    ("garbage", "no 'end' after the last finding"),
    (GOOD, "no 'end' after the last finding"),
    ("end", "'end' without findings; an empty answer is 'none'"),
    (f"{GOOD} ; end ; vessel", "text after 'end'"),
    (f"{GOOD} ; ; end", "finding 2 of 2 is empty"),
    ("lesion slice 3 box [12, 40, 88] ; end", "finding 1 of 1 (lesion): box: found 3 numbers"),
    ("lesion slice 3 box [1, 2, 3, 4, 5] ; end", "box: found 5 numbers, expected 4"),
    ("lesion slice box [1, 2, 3, 4] ; end", "slice: no number found"),
    ("lesion slice 3 4 box [1, 2, 3, 4] ; end", "slice: found 2 numbers, expected 1"),
    ("lesion slice 3.5 box [1, 2, 3, 4] ; end", "slice index 3.5 is not a whole number"),
    ("lesion slice 8 box [1, 2, 3, 4] ; end", "slice index 8 is not among the 8 images"),
    ("tumor slice 3 box [1, 2, 3, 4] ; end", "unknown kind 'tumor'; expected lesion, vessel"),
    ("[UNK] slice 3 box [1, 2, 3, 4] ; end", "unknown kind '[UNK]'"),
    ("lesion 3 box [1, 2, 3, 4] ; end", "expected '<kind> slice <index> box"),
    ("lesion slice 3 [1, 2, 3, 4] ; end", "expected '<kind> slice <index> box"),
    ("lesion slice 3 box [88, 40, 12, 101] ; end", "has row0 >= row1"),
    ("lesion slice 3 box [12, 101, 88, 40] ; end", "has col0 >= col1"),
    ("lesion slice 3 box [12, 40, 12, 101] ; end", "has row0 >= row1"),
    ("lesion slice 3 box [12, 40, 88, 4000] ; end", "value 4000 outside [0, 3000]"),
    ("lesion slice 3 box [12, -40, 88, 101] ; end", "value -40 outside [0, 3000]"),
    (f"{GOOD} ; vessel slice 1 box [1, 2, 3] ; end", "finding 2 of 2 (vessel): box: found 3"),
    ("none ; end", "finding 1 of 1: expected"),
]


@pytest.mark.parametrize(("text", "reason"), BAD_FIND)
def test_parse_find_reports_malformed_answers(text: str, reason: str) -> None:
    parsed = parse_find(text, num_images=8)
    assert not parsed.success
    assert parsed.reason is not None and reason in parsed.reason


def test_one_bad_finding_fails_the_whole_answer() -> None:
    parsed = parse_find(f"{GOOD} ; vessel slice 1 box [1, 2, 3] ; {GOOD} ; end")
    assert not parsed.success
    assert parsed.findings == (FoundFinding(LESION, 3, (12, 40, 88, 101)),)  # diagnostics only


def test_parse_find_tolerates_case_and_trailing_special_tokens() -> None:
    expected = ParsedFind((FoundFinding(LESION, 3, (12, 40, 88, 101)),), True)
    assert parse_find(f"{GOOD} ; end<|im_end|>") == expected
    assert parse_find("Lesion Slice 3 BOX [12,40,88,101];END <|im_end|><|endoftext|>") == expected
    assert parse_find("None<|im_end|>") == ParsedFind((), True)
    assert parse_find(f"{GOOD} ; end", num_images=None).success
    assert parse_find(f"{GOOD} ; end", num_images=4).success


@pytest.mark.parametrize(
    ("text", "kind", "reason"),
    [
        ("32 mm", LESION, "lesion: found 1 number, expected 2"),
        ("32 x 18 x 4 mm", LESION, "lesion: found 3 numbers, expected 2"),
        ("32 x 18 mm", VESSEL, "vessel: found 2 numbers, expected 1"),
        ("", VESSEL, "vessel: no number found"),
        ("none", LESION, "lesion: no number found"),
        ("[UNK] [UNK]", VESSEL, "vessel: no number found"),
        ("4000 mm", VESSEL, "vessel: value 4000 outside [0, 3000]"),
    ],
)
def test_parse_measure_reports_malformed_answers(text: str, kind: FindingKind, reason: str) -> None:
    parsed = parse_measure(text, kind)
    assert not parsed.success
    assert parsed.reason == reason


def test_parse_measure_returns_values_as_written() -> None:
    assert parse_measure("18 x 32 mm", LESION) == ParsedMeasure((18.0, 32.0), True)
    assert parse_measure("31 mm<|im_end|>", "vessel") == ParsedMeasure((31.0,), True)
    with pytest.raises(ValueError, match="unknown finding kind"):
        parse_measure("31 mm", "organ")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty answer"),
        ("32 mm", "answer does not start with lesion, vessel or none"),
        ("[UNK] 3 mm", "answer does not start with lesion, vessel or none"),
        ("tumor 3 mm", "unknown kind 'tumor'; expected lesion, vessel or none"),
        ("lesion 32 mm", "lesion: found 1 number, expected 2"),
        ("vessel 32 x 18 mm", "vessel: found 2 numbers, expected 1"),
        ("vessel mm", "vessel: no number found"),
        ("none 3 mm", "'none' followed by numbers"),
    ],
)
def test_parse_point_reports_malformed_answers(text: str, reason: str) -> None:
    parsed = parse_point(text)
    assert not parsed.success
    assert parsed.reason is not None and parsed.reason.startswith(reason)


def test_parse_point_tolerates_case_and_trailing_special_tokens() -> None:
    assert parse_point("Vessel 31 MM<|im_end|>") == ParsedPoint(VESSEL, (31.0,), True)
    assert parse_point("lesion 18 x 32 mm") == ParsedPoint(LESION, (18.0, 32.0), True)


def test_parsed_results_are_consistent_by_construction() -> None:
    with pytest.raises(ValueError, match="a failed one needs a reason"):
        ParsedFind((), False)
    with pytest.raises(ValueError, match="a successful parse has reason=None"):
        ParsedMeasure((), True, "why")
    with pytest.raises(ValueError, match="a failed one needs a reason"):
        ParsedPoint(None, (), False)


@given(st.text(max_size=80))
def test_parsers_never_raise_on_text(text: str) -> None:
    for parsed in (
        parse_find(text),
        parse_find(text, num_images=3),
        parse_measure(text, LESION),
        parse_measure(text, VESSEL),
        parse_point(text),
    ):
        assert parsed.success == (parsed.reason is None)


@given(st.lists(st.integers(0, len(VOCAB) - 1), max_size=40))
def test_parsers_never_raise_on_decoded_tokens(
    tokenizer: PreTrainedTokenizerFast, ids: list[int]
) -> None:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if NUM_TOKEN in text:  # an RNED text: give each [NUM] a value, as generation would
        text = with_values(text, [1.0] * text.count(NUM_TOKEN))
    for parsed in (parse_find(text), parse_measure(text, LESION), parse_point(text)):
        assert parsed.success == (parsed.reason is None)


def test_one_image_answers_leave_the_slice_out() -> None:
    findings = [FoundFinding(LESION, 0, (12, 40, 88, 101)), FoundFinding(VESSEL, 0, (1, 2, 3, 4))]
    text = find_answer(findings, num_images=1)
    assert text == "lesion box [12, 40, 88, 101] ; vessel box [1, 2, 3, 4] ; end"
    assert parse_find(text, num_images=1) == ParsedFind(tuple(findings), True)
    assert not parse_find(text, num_images=2).success  # several images need the slice
    with_slice = parse_find("lesion slice 0 box [12, 40, 88, 101] ; end", num_images=1)
    assert not with_slice.success and "<kind> box" in (with_slice.reason or "")
    with pytest.raises(ValueError, match="one-image answer"):
        find_answer([FoundFinding(LESION, 2, (12, 40, 88, 101))], num_images=1)
    assert find_answer([], num_images=1) == "none"
