"""Text <-> [NUM] conversion, canonical spelling, the plain-text answer parser and templates."""

from __future__ import annotations

import math
from dataclasses import astuple
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import model.numeric.text as text_module
from model.numeric.text import (
    NUM_TOKEN,
    NumText,
    ParsedAnswer,
    answer_text,
    format_box,
    format_dual,
    format_single,
    from_num_text,
    parse_box,
    parse_dual,
    parse_single,
    parse_values,
    to_num_text,
)

# --- strategies --------------------------------------------------------------------------------

GRID_INDEX = st.integers(0, 30_000)  # value = index / 10 on the default grid [0, 3000], step 0.1


def canonical(index: int) -> str:
    """The canonical spelling of ``index / 10``, written independently of the module."""
    whole, tenth = divmod(index, 10)
    return f"{whole}" if tenth == 0 else f"{whole}.{tenth}"


SENTENCES = [
    "diameter {0} mm",
    "aortic diameter {0} mm at the level of T12",
    "{0}mm",
    "density {0} HU",
    "{0}",
    "long axis {0} mm, short axis {1} mm",
    "{0} x {1} mm",
    "{0}x{1}mm",
    "{0} × {1} mm",
    "{0} by {1} mm",
    "{0}mm x {1}mm",
    "{0}X{1}MM",
    "T2-weighted CT3 series, L4 level, 3D: {0} x {1} mm.",
    "[{0}, {1}, {2}, {3}]",
    "box [{0},{1},{2},{3}] on the 3rd slice",
]

WORDS = [
    "lesion", "mm", "cm", "HU", "x", "×", "by", ",", ".", "(", ")", "[", "]", "-", "%",
    "T2", "CT3", "S1", "L4", "C7", "2D", "3D", "3rd", "v1.5", "1.2.3", "1e3", "lesion_3",
]  # fmt: skip


@st.composite
def sentence(draw: st.DrawFn) -> tuple[str, list[int]]:
    """A template and the grid indices of the values to fill it with."""
    template = draw(st.sampled_from(SENTENCES))
    return template, [draw(GRID_INDEX) for _ in range(template.count("{"))]


@st.composite
def word_soup(draw: st.DrawFn) -> tuple[str, list[int]]:
    """Identifiers, units, punctuation and canonical numbers joined by spaces."""
    items = draw(st.lists(st.one_of(st.sampled_from(WORDS), GRID_INDEX), max_size=12))
    indices = [i for i in items if isinstance(i, int)]
    return " ".join(canonical(i) if isinstance(i, int) else i for i in items), indices


NON_CANONICAL = st.from_regex(r"\A(?:[0-9]{1,4}(?:\.[0-9]{1,4})?|\.[0-9]{1,3})\Z").filter(
    lambda s: Decimal(s) <= 3000
)


def snapped(literal: str) -> float:
    """Independent reference: ties away from zero on the 0.1 grid."""
    return float(Decimal(literal.replace("−", "-")).quantize(Decimal("0.1"), ROUND_HALF_UP))


# --- round trips (properties) ------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(sentence())
def test_canonical_sentences_round_trip(case: tuple[str, list[int]]) -> None:
    template, indices = case
    text = template.format(*map(canonical, indices))
    num_text = to_num_text(text)
    assert num_text == NumText(
        template.format(*[NUM_TOKEN] * len(indices)), tuple(i / 10 for i in indices)
    )
    assert from_num_text(*astuple(num_text)) == text


@settings(max_examples=300, deadline=None)
@given(word_soup())
def test_word_soup_round_trips_and_keeps_identifiers(case: tuple[str, list[int]]) -> None:
    text, indices = case
    num_text = to_num_text(text)
    assert num_text.values == tuple(i / 10 for i in indices)
    assert from_num_text(*astuple(num_text)) == text


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SENTENCES), st.lists(NON_CANONICAL, min_size=4, max_size=4))
def test_non_canonical_spellings_reach_a_fixed_point(template: str, literals: list[str]) -> None:
    text = template.format(*literals)
    first = to_num_text(text)
    assert first.values == tuple(snapped(s) for s in literals[: template.count("{")])
    again = to_num_text(from_num_text(*astuple(first)))
    assert again == first
    assert from_num_text(*astuple(again)) == from_num_text(*astuple(first))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["density {0} HU", "({0}) and {1}", "{0} to {1} HU", "[{0}, {1}]"]),
    st.lists(st.tuples(st.sampled_from(["", "-", "−"]), NON_CANONICAL), min_size=2, max_size=2),
)
def test_signed_values_reach_a_fixed_point(template: str, parts: list[tuple[str, str]]) -> None:
    literals = [sign + digits for sign, digits in parts]
    first = to_num_text(template.format(*literals), lo=-3000, hi=3000)
    assert first.values == tuple(snapped(s) + 0.0 for s in literals[: template.count("{")])
    assert to_num_text(from_num_text(*astuple(first)), lo=-3000, hi=3000) == first


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="0123456789.-−+x ,mcMHU_T()[]µ²e", max_size=40)))
def test_any_convertible_text_is_a_fixed_point_after_one_pass(text: str) -> None:
    wide = {"lo": -1e12, "hi": 1e12}
    try:
        first = to_num_text(text, **wide)
    except ValueError:
        return  # a number beyond 1e12 or a literal [NUM]: refused, tested elsewhere
    second = to_num_text(from_num_text(*astuple(first)), **wide)
    assert second == first


# --- number detection (examples) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected_text", "values"),
    [
        ("long axis 32.5 mm, short axis 18 mm",
         "long axis [NUM] mm, short axis [NUM] mm", (32.5, 18)),
        ("32 x 18 mm", "[NUM] x [NUM] mm", (32, 18)),
        ("32x18mm", "[NUM]x[NUM]mm", (32, 18)),
        ("32 × 18 mm", "[NUM] × [NUM] mm", (32, 18)),
        ("32×18mm", "[NUM]×[NUM]mm", (32, 18)),
        ("32mmx18mm", "[NUM]mmx[NUM]mm", (32, 18)),
        ("32 by 18 mm", "[NUM] by [NUM] mm", (32, 18)),
        ("[12, 40, 88, 101]", "[[NUM], [NUM], [NUM], [NUM]]", (12, 40, 88, 101)),
        ("diameter 31.0 mm", "diameter [NUM] mm", (31,)),
        ("0.5", "[NUM]", (0.5,)),
        ("(.5 cm)", "([NUM] cm)", (0.5,)),
        ("3000", "[NUM]", (3000,)),
        ("0", "[NUM]", (0,)),
        ("40HU, 40 HU, 50%, 12cc, 3 ml, 18MM, 2.5cm, 18mm², 9 µm", None,
         (40, 40, 50, 12, 3, 18, 2.5, 18, 9)),
        ("32,5 mm", "[NUM],[NUM] mm", (32, 5)),  # a comma always separates numbers
        ("1,200", "[NUM],[NUM]", (1, 200)),
        ("3-5 mm", "[NUM]-[NUM] mm", (3, 5)),  # a dash after a digit is a range, not a sign
        ("3 - 5 mm", "[NUM] - [NUM] mm", (3, 5)),
        ("L4-5", "L4-[NUM]", (5,)),
        ("+3 mm", "+[NUM] mm", (3,)),
        ("Size 32.5.", "Size [NUM].", (32.5,)),
        ("1. Lesion 32 mm", "[NUM]. Lesion [NUM] mm", (1, 32)),
    ],
)  # fmt: skip
def test_formats(text: str, expected_text: str | None, values: tuple[float, ...]) -> None:
    num_text = to_num_text(text)
    assert num_text.values == tuple(float(v) for v in values)
    if expected_text is not None:
        assert num_text.text == expected_text
    written = {"diameter 31.0 mm": "diameter 31 mm", "(.5 cm)": "(0.5 cm)"}.get(text, text)
    assert from_num_text(*astuple(num_text)) == written


@pytest.mark.parametrize(
    "identifier",
    ["T2", "CT3", "S1", "L4", "C7", "T12", "2D", "3D", "3rd", "1st", "v1.5", "1.2.3", "1e3",
     "x18", "18x", "lesion_3", "3_a", "0x1F", "Fig.5", "12.03.2024", "5²", "A1c", "٣"],
)  # fmt: skip
def test_identifiers_are_not_converted(identifier: str) -> None:
    text = f"axial {identifier} image, see {identifier}."
    assert to_num_text(text) == NumText(text, ())
    assert parse_values(text, 1).reason == "no number found"


def test_identifiers_beside_a_measurement() -> None:
    text = "T2-weighted CT3 at L4/S1 (3D): 32x18mm, C7 clear"
    assert to_num_text(text) == NumText(
        "T2-weighted CT3 at L4/S1 (3D): [NUM]x[NUM]mm, C7 clear", (32.0, 18.0)
    )


# --- signs, ranges and rounding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("-3 mm", "-3"),
        ("(−3)", "−3"),
        ("32 x -18 mm", "-18"),
        ("4000 mm", "4000"),
        ("3000.04", "3000.04"),  # checked before snapping: no silent clamp to 3000
        ("-0.04", "-0.04"),
        ("9" * 60, "99999999999…99999999999"),
    ],
)
def test_out_of_range_values_are_rejected_with_the_value_named(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=rf"value {named} outside \[0, 3000\]"):
        to_num_text(text)


def test_range_bounds_are_inclusive_and_configurable() -> None:
    assert to_num_text("0 and 3000").values == (0.0, 3000.0)
    assert to_num_text("-1024 HU, -3 HU", lo=-1024, hi=3071, step=1).values == (-1024.0, -3.0)
    assert to_num_text("(-3) x −2.25", lo=-10) == NumText("([NUM]) x [NUM]", (-3.0, -2.3))
    with pytest.raises(ValueError, match=r"value 401 outside \[0, 400\]"):
        to_num_text("[12, 40, 401, 101]", hi=400)


def test_a_minus_zero_keeps_its_sign_as_text() -> None:
    assert to_num_text("-0 mm") == NumText("-[NUM] mm", (0.0,))
    assert to_num_text("-0.04", lo=-10) == NumText("-[NUM]", (0.0,))
    assert from_num_text("-[NUM]", [0.0]) == "-0"


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("0.05", 0.1), ("0.15", 0.2), ("2.25", 2.3), ("2.35", 2.4), ("0.04", 0.0), ("32.549", 32.5),
        ("32.55", 32.6), ("2999.95", 3000.0), ("0.0500000000000000000000000000001", 0.1),
        ("0.0499999999999999999999999999999", 0.0),
    ],
)  # fmt: skip
def test_rounding_is_half_away_from_zero_on_the_exact_decimal(literal: str, value: float) -> None:
    assert to_num_text(literal).values == (value,)


def test_negative_ties_round_away_from_zero() -> None:
    assert to_num_text("-2.25 -0.05 -2.24", lo=-10).values == (-2.3, -0.1, -2.2)


@pytest.mark.parametrize(
    ("step", "literal", "value", "written"),
    [
        (0.25, "32.1", 32.0, "32"),
        (0.25, "32.125", 32.25, "32.25"),
        (0.25, "32.75", 32.75, "32.75"),
        (1, "32.5", 33.0, "33"),
        (5, "12", 10.0, "10"),
        (5, "2", 0.0, "0"),
        (0.01, "0.505", 0.51, "0.51"),
    ],
)
def test_other_steps(step: float, literal: str, value: float, written: str) -> None:
    num_text = to_num_text(literal, step=step)
    assert num_text.values == (value,)
    assert from_num_text(*astuple(num_text), step=step) == written


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": 0}, "step must be a positive"),
        ({"step": -0.1}, "step must be a positive"),
        ({"step": math.nan}, "step must be a positive"),
        ({"lo": 10, "hi": 5}, r"lo <= hi"),
        ({"hi": math.inf}, r"finite"),
        ({"hi": 3000.05}, r"hi=3000.05 is not a multiple of step=0.1"),
        ({"lo": 0.3, "step": 0.25}, r"lo=0.3 is not a multiple of step=0.25"),
    ],
)
def test_bad_grid_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_num_text("32 mm", **kwargs)


def test_values_a_float_cannot_hold_on_the_grid_are_refused() -> None:
    with pytest.raises(ValueError, match=r"value 999999999999999.9 is not representable"):
        to_num_text("999999999999999.9", hi=1e15)
    with pytest.raises(ValueError, match=r"value 1e\+300 is not representable"):
        from_num_text("[NUM]", [1e300])


def test_text_already_holding_num_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match=r"already contains \[NUM\]"):
        to_num_text("[NUM] x 18 mm")


# --- from_num_text -----------------------------------------------------------------------------


def test_canonical_spelling() -> None:
    values = [18.0, 32.5, 0.5, 3000.0, 0.0, -0.0, -3.0, 32.56, 0.15, 1e-20, 7]
    written = from_num_text(" ".join([NUM_TOKEN] * len(values)), values)
    assert written == "18 32.5 0.5 3000 0 0 -3 32.6 0.2 0 7"


def test_from_num_text_accepts_numpy_scalars_and_keeps_units() -> None:
    assert from_num_text("[NUM]mm x [NUM] HU", np.array([0.15, 40.0])) == "0.2mm x 40 HU"  # type: ignore[arg-type]


@pytest.mark.parametrize(("tokens", "values"), [(2, [1.0]), (1, [1.0, 2.0]), (0, [3.0])])
def test_from_num_text_counts_must_match(tokens: int, values: list[float]) -> None:
    with pytest.raises(ValueError, match=rf"{tokens} \[NUM\] tokens but {len(values)} values"):
        from_num_text(" x ".join([NUM_TOKEN] * tokens) + " mm", values)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_from_num_text_rejects_non_finite_values(bad: float) -> None:
    with pytest.raises(ValueError, match="not finite"):
        from_num_text("[NUM]", [bad])


def test_num_text_is_valid_from_construction() -> None:
    assert NumText("[NUM] mm", (3,)).values == (3.0,)
    with pytest.raises(ValueError, match=r"1 \[NUM\] tokens but 2 values"):
        NumText("[NUM] mm", (3.0, 4.0))
    with pytest.raises(ValueError, match="not finite"):
        NumText("[NUM] mm", (math.nan,))


# --- parse_values ------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.text(), st.sampled_from([1, 2, 4]))
def test_parse_values_never_raises_and_success_agrees_with_the_count(
    answer: str, expected: int
) -> None:
    parsed = parse_values(answer, expected)
    in_range = all(0 <= v <= 3000 for v in parsed.values)
    assert parsed.success == (len(parsed.values) == expected and in_range)
    assert (parsed.reason is None) == parsed.success
    if parsed.success and NUM_TOKEN not in answer:
        assert len(to_num_text(answer).values) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(GRID_INDEX, min_size=1, max_size=4),
    st.sampled_from([" x ", "x", " × ", " by ", "  x  ", ", "]),
    st.sampled_from(["mm", "MM", ""]),
    st.sampled_from(["", "</s>", "<|im_end|>", " mm mm", ".", "\n\nDone", "  "]),
)
def test_parse_values_reads_noisy_answers(
    indices: list[int], separator: str, unit: str, noise: str
) -> None:
    answer = separator.join(canonical(i) + unit for i in indices) + noise
    parsed = parse_values("  " + answer, len(indices))
    assert parsed == ParsedAnswer(tuple(i / 10 for i in indices), True)


@pytest.mark.parametrize(
    ("answer", "expected", "reason"),
    [
        ("", 1, "no number found"),
        ("The lesion is not measurable.", 1, "no number found"),
        ("T2 hyperintense, 3D", 2, "no number found"),
        ("32 x 18 x 12 mm", 2, "found 3 numbers, expected 2"),
        ("32 mm", 2, "found 1 number, expected 2"),
        ("32,5 mm", 1, "found 2 numbers, expected 1"),
        ("4000 mm", 1, "value 4000 outside [0, 3000]"),
        ("-3 x 18 mm", 2, "value -3 outside [0, 3000]"),
        ("[12, 40, 88, 3001.5]", 4, "value 3001.5 outside [0, 3000]"),
    ],
)
def test_parse_failure_reasons(answer: str, expected: int, reason: str) -> None:
    parsed = parse_values(answer, expected)
    assert not parsed.success
    assert parsed.reason == reason


def test_parse_helpers() -> None:
    assert parse_single("T2: diameter 31.0mm") == ParsedAnswer((31.0,), True)
    assert parse_dual("18 by 32mm</s>") == ParsedAnswer((32.0, 18.0), True)  # sorted long, short
    assert parse_dual("18 x 32 x 5 mm").values == (18.0, 32.0, 5.0)  # failure: order as written
    assert parse_box("[88, 40, 12, 101]") == ParsedAnswer((88.0, 40.0, 12.0, 101.0), True)
    assert parse_box("[12, 40, 88, 401]", hi=400).reason == "value 401 outside [0, 400]"
    assert parse_values("-0 mm", 1) == ParsedAnswer((0.0,), True)


@pytest.mark.parametrize("expected", [0, -1, True, 2.0])
def test_parse_values_rejects_a_bad_expected_count(expected: int) -> None:
    with pytest.raises(ValueError, match="expected must be a positive int"):
        parse_values("32 mm", expected)


def test_parsed_answer_is_valid_from_construction() -> None:
    with pytest.raises(ValueError, match="reason"):
        ParsedAnswer((1.0,), True, "oops")
    with pytest.raises(ValueError, match="reason"):
        ParsedAnswer((), False)


# --- templates ---------------------------------------------------------------------------------


def test_templates_in_both_modes() -> None:
    assert format_dual(32.5, 18, num_tokens=True) == NumText("[NUM] x [NUM] mm", (32.5, 18.0))
    assert format_dual(32.5, 18, num_tokens=False) == NumText("32.5 x 18 mm", ())
    assert format_single(0.15, num_tokens=False) == NumText("0.2 mm", ())
    assert format_single(31, num_tokens=True, unit="HU") == NumText("[NUM] HU", (31.0,))
    assert format_box([12, 40, 88, 101], num_tokens=False) == NumText("[12, 40, 88, 101]", ())
    assert format_box((12, 40, 88, 101), num_tokens=True) == NumText(
        "[[NUM], [NUM], [NUM], [NUM]]", (12.0, 40.0, 88.0, 101.0)
    )
    assert answer_text([-3], num_tokens=False, unit="HU", lo=-1024) == NumText("-3 HU", ())


def test_template_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="pass \\(long, short\\)"):
        format_dual(18, 32.5, num_tokens=True)
    with pytest.raises(ValueError, match="4 coordinates"):
        format_box([1, 2, 3], num_tokens=True)
    with pytest.raises(ValueError, match="empty"):
        answer_text([], num_tokens=True)
    with pytest.raises(ValueError, match=r"value 4000.0 outside \[0, 3000\]"):
        format_single(4000, num_tokens=False)
    with pytest.raises(ValueError, match="not finite"):
        format_single(math.nan, num_tokens=False)
    for separator, unit in [("", "mm"), (".", "mm"), (" x ", "[NUM]"), (" x", "mm")]:
        with pytest.raises(ValueError, match="change how the numbers read"):
            answer_text([32, 18], num_tokens=True, separator=separator, unit=unit)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 3000), min_size=1, max_size=4),
    st.sampled_from([" x ", "x", " × ", " by ", ", "]),
    st.sampled_from(["mm", "cm", "HU", "mm²", ""]),
)
def test_plain_answers_read_back_as_their_num_text(
    values: list[float], separator: str, unit: str
) -> None:
    tokens = answer_text(values, num_tokens=True, separator=separator, unit=unit)
    plain = answer_text(values, num_tokens=False, separator=separator, unit=unit)
    assert to_num_text(plain.text) == tokens
    assert from_num_text(*astuple(tokens)) == plain.text
    assert parse_values(plain.text, len(values)) == ParsedAnswer(tokens.values, True)


def test_public_names_are_listed() -> None:
    assert text_module.__all__ == sorted(text_module.__all__)
    public = {n for n in vars(text_module) if not n.startswith("_")}
    imported = {"annotations", "astuple", "math", "re", "dataclass", "Context", "Decimal"}
    imported |= {"Fraction", "Iterator", "Sequence"}
    assert public - imported == set(text_module.__all__)
