"""Numbers in answer text <-> ``[NUM]`` tokens with their values, and the plain-text answer parser.

With RNED every number of a text becomes one ``[NUM]`` token whose value travels beside the
text (:func:`to_num_text`, :func:`from_num_text`); the standard-token baseline keeps numbers as
text and reads them back after generation (:func:`parse_values`). Both sides find numbers with
the same rules, so "success" means the same thing for every method. Pure Python, no torch.

Which numbers are converted
---------------------------
The text is cut into *glued words*: maximal runs of word characters (letters, digits,
underscore) in which a ``.`` may join two word characters, optionally starting with a ``.``
that does not follow a word character or a ``.``. A glued word is numeric when it reads, as a
whole, as numbers each optionally followed by a unit of :data:`GLUED_UNITS` (any case), joined
by ``x`` or ``by``; every number in a numeric glued word is converted, any other glued word is
kept verbatim. A number is ASCII digits with an optional fraction (``32``, ``32.5``, ``032``) or
a fraction alone (``.5``). Hence:

- converted: ``32.5``, ``18 mm``, ``18mm``, ``32x18mm``, ``32mmx18mm``, ``32 × 18 mm``,
  ``[12, 40, 88, 101]``, ``40HU``, ``50%``, ``0.5``, ``.5``;
- kept verbatim (identifiers): ``T2``, ``CT3``, ``S1``, ``L4``, ``C7``, ``2D``, ``3D``, ``3rd``,
  ``v1.5``, ``1.2.3``, ``1e3``, ``x18``, ``18x``, ``lesion_3``;
- the comma is never a decimal mark: inside boxes it separates numbers, so ``32,5`` is the two
  numbers 32 and 5 and ``1,200`` is 1 and 200;
- a ``-`` (or U+2212 ``−``) directly before a number is its sign unless it directly follows a
  word character: ``-3``, ``(-3)`` and ``x -3`` are minus three, while ``3-5``, ``L4-5`` and
  ``3 - 5`` hold the dash as text. ``+`` is always text.

The value grid and rounding
---------------------------
:func:`to_num_text` reads each number exactly (``decimal``, never through a float), checks it
against ``[lo, hi]`` *before* rounding (no silent clamp: ``3000.04`` is outside ``[0, 3000]``)
and snaps it to the nearest multiple of ``step``, **ties away from zero** (``0.05`` -> 0.1,
``2.25`` -> 2.3, ``-2.25`` -> -2.3; Python's ``round`` would give 0.1 for ``0.15`` and 2.2 for
``2.25``). ``lo`` and ``hi`` must lie on the grid, so a snapped value stays inside the range.
A grid value needing more than 15 significant digits cannot be carried exactly by a float64 and
is refused. A sign whose number snaps to zero (``-0``, ``-0.04`` with ``lo < 0``) stays in the
text, so that every round trip is a fixed point.

Canonical spelling
------------------
:func:`from_num_text` writes each value snapped to the grid (float values are taken at their
shortest ``repr``) with the fewest digits that state it exactly: no exponent, no leading zeros,
no trailing fractional zeros, no trailing dot, zero as ``0`` and a minus only for negatives
(``18``, ``32.5``, ``0.5``, ``3000``, ``-3``). ``from_num_text(*astuple(to_num_text(s)))``
returns ``s`` whenever ``s`` spells its numbers canonically; other spellings (``18.0``, ``032``,
``32.50``, ``.5``, ``32.55``) come back canonical (``18``, ``32``, ``32.5``, ``0.5``, ``32.6``)
and a second pass changes nothing.

Success of a plain-text answer
------------------------------
As in the RNED paper: an answer succeeds iff it parses into exactly the expected count of values
(1 single, 2 dual, 4 box), each inside ``[lo, hi]``. :func:`parse_values` never raises on model
output: a failed answer gets ``success=False`` and a reason. Values are returned as written
(not snapped) and are not converted between units.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass
from decimal import Context, Decimal
from fractions import Fraction

__all__ = [
    "GLUED_UNITS",
    "NUM_TOKEN",
    "NumText",
    "ParsedAnswer",
    "answer_text",
    "format_box",
    "format_dual",
    "format_single",
    "from_num_text",
    "parse_box",
    "parse_dual",
    "parse_single",
    "parse_values",
    "to_num_text",
]

NUM_TOKEN = "[NUM]"
"""The token that stands for one number; its value travels in ``NumText.values``."""

GLUED_UNITS: frozenset[str] = frozenset(
    {"mm", "cm", "m", "um", "µm", "μm", "ml", "cc", "hu"}
    | {"mm2", "mm²", "cm2", "cm²", "mm3", "mm³", "cm3", "cm³"}
)
"""Units (matched in any case) that may be glued to a number without making it an identifier."""

_FLOAT_DIGITS = 15  # every decimal of up to 15 significant digits survives a float64 round trip
_CONTEXT = Context(prec=60)  # exact for grid values (<= 16 digits) times steps (<= 17 digits)
_MAX_SHOWN = 24  # longest number literal quoted in full by an error message or reason

_WORD_CHAR = re.compile(r"\w")
_GLUED_WORD = re.compile(r"(?<![\w.])\.?\w+(?:\.\w+)*")
_UNIT = "|".join(re.escape(u) for u in sorted(GLUED_UNITS, key=len, reverse=True))
_NUMBER_UNIT = re.compile(rf"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:{_UNIT})?", re.IGNORECASE)
_SEPARATOR = re.compile(r"x|by", re.IGNORECASE)
_MINUS = frozenset("-\u2212")


@dataclass(frozen=True, slots=True)
class NumText:
    """A text whose numbers are ``[NUM]`` tokens, and their values in order.

    Valid from construction: as many values as ``[NUM]`` tokens, all finite (stored as floats).
    """

    text: str
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.values)
        count = self.text.count(NUM_TOKEN)
        if count != len(values):
            raise ValueError(
                f"text has {count} {NUM_TOKEN} tokens but {len(values)} values were given; "
                "give one value per token"
            )
        for v in values:
            if not math.isfinite(v):
                raise ValueError(f"value {v!r} is not finite; [NUM] values must be finite")
        object.__setattr__(self, "values", values)


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    """What :func:`parse_values` read from a plain-text answer.

    ``values`` are every number found, in order and as written (kept on failure, for
    diagnostics, where a number beyond the float range reads as ``inf``; use them only when
    ``success``). ``reason`` says why a parse failed and is ``None`` exactly when it succeeded.
    """

    values: tuple[float, ...]
    success: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.success == (self.reason is not None):
            raise ValueError(
                "a successful ParsedAnswer has reason=None and a failed one needs a reason; "
                f"got success={self.success}, reason={self.reason!r}"
            )


@dataclass(frozen=True, slots=True)
class _Number:
    """One number found in a text: ``text[start:end]`` is ``literal`` (its sign included)."""

    start: int
    end: int
    literal: str
    value: Decimal
    signed: bool


def to_num_text(text: str, *, lo: float = 0.0, hi: float = 3000.0, step: float = 0.1) -> NumText:
    """Replace every number of ``text`` by ``[NUM]`` and collect its value snapped to the grid.

    Numbers are found and snapped by the rules of the module docstring; all other text (units
    included) is kept verbatim. Raises ``ValueError`` for a number outside ``[lo, hi]`` (naming
    it and the range), a value a float64 cannot hold on the grid, a text that already holds
    ``[NUM]``, or a grid whose ``lo`` / ``hi`` are not multiples of a positive ``step``.

    >>> to_num_text("long axis 32.5 mm, short axis 18 mm")
    NumText(text='long axis [NUM] mm, short axis [NUM] mm', values=(32.5, 18.0))
    """
    d_lo, d_hi, d_step = _grid(lo, hi, step)
    if NUM_TOKEN in text:
        raise ValueError(
            f"text already contains {NUM_TOKEN}: {_shorten(text, 60)!r}; "
            "pass the plain text, or use from_num_text first"
        )
    pieces: list[str] = []
    values: list[float] = []
    position = 0
    for number in _find_numbers(text):
        _check_range(number, d_lo, d_hi)
        value = _snap(number.value, d_step, number.literal)
        start = number.start + 1 if number.signed and value == 0 else number.start
        pieces += [text[position:start], NUM_TOKEN]
        values.append(float(value))
        position = number.end
    pieces.append(text[position:])
    return NumText("".join(pieces), tuple(values))


def from_num_text(text: str, values: Sequence[float], *, step: float = 0.1) -> str:
    """Write each ``[NUM]`` of ``text`` as its value, snapped to the grid, in canonical form.

    Canonical form: fewest digits that state the grid value exactly (``18``, ``32.5``, ``0.5``);
    off-grid values are snapped ties away from zero. Raises ``ValueError`` when the counts of
    ``[NUM]`` tokens and values differ, or for a value that is not finite or not representable.

    >>> from_num_text("[NUM] x [NUM] mm", [32.5, 18.0])
    '32.5 x 18 mm'
    """
    d_step = _positive_step(step)
    pieces = text.split(NUM_TOKEN)
    if len(pieces) - 1 != len(values):
        raise ValueError(
            f"text has {len(pieces) - 1} {NUM_TOKEN} tokens but {len(values)} values were "
            "given; give one value per token"
        )
    out = [pieces[0]]
    for value, piece in zip(values, pieces[1:], strict=True):
        out += [_format(_snap(_decimal(value), d_step, repr(float(value)))), piece]
    return "".join(out)


def parse_values(
    answer: str, expected: int, *, lo: float = 0.0, hi: float = 3000.0
) -> ParsedAnswer:
    """Read a plain-text answer: success iff exactly ``expected`` numbers, all in ``[lo, hi]``.

    Numbers are found by the module's rules (``x``, ``×``, ``by``, commas, spaces and units,
    glued or not, all separate them; identifiers such as ``T2`` do not count). Never raises on
    ``answer``; raises ``ValueError`` only for a bad ``expected`` / ``lo`` / ``hi``. Reasons:
    ``"no number found"``, ``"found 3 numbers, expected 2"``, ``"value 4000 outside [0, 3000]"``.

    >>> parse_values("32 x 18 mm</s>", 2)
    ParsedAnswer(values=(32.0, 18.0), success=True, reason=None)
    """
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise ValueError(
            f"expected must be a positive int (1 single, 2 dual, 4 box), not {expected!r}"
        )
    d_lo, d_hi = _range(lo, hi)
    numbers = list(_find_numbers(answer))
    values = tuple(float(n.value) + 0.0 for n in numbers)  # + 0.0 turns -0.0 into 0.0
    if not numbers:
        return ParsedAnswer(values, False, "no number found")
    if len(numbers) != expected:
        noun = "number" if len(numbers) == 1 else "numbers"
        return ParsedAnswer(values, False, f"found {len(numbers)} {noun}, expected {expected}")
    for number in numbers:
        if not d_lo <= number.value <= d_hi:
            return ParsedAnswer(values, False, _outside(number.literal, d_lo, d_hi))
    return ParsedAnswer(values, True)


def parse_single(answer: str, *, lo: float = 0.0, hi: float = 3000.0) -> ParsedAnswer:
    """:func:`parse_values` expecting one value (a diameter, a length, a density)."""
    return parse_values(answer, 1, lo=lo, hi=hi)


def parse_dual(answer: str, *, lo: float = 0.0, hi: float = 3000.0) -> ParsedAnswer:
    """:func:`parse_values` expecting two values, returned as ``(long, short)``.

    On success the values are sorted in descending order whatever order the answer used
    ("18 x 32 mm" -> ``(32.0, 18.0)``), as the paper's long- and short-axis errors assume; a
    failed parse keeps the order of the text.
    """
    parsed = parse_values(answer, 2, lo=lo, hi=hi)
    if not parsed.success:
        return parsed
    return ParsedAnswer(tuple(sorted(parsed.values, reverse=True)), True)


def parse_box(answer: str, *, lo: float = 0.0, hi: float = 3000.0) -> ParsedAnswer:
    """:func:`parse_values` expecting the four box coordinates, in the order written."""
    return parse_values(answer, 4, lo=lo, hi=hi)


def answer_text(
    values: Sequence[float],
    *,
    num_tokens: bool,
    unit: str = "mm",
    separator: str = " x ",
    lo: float = 0.0,
    hi: float = 3000.0,
    step: float = 0.1,
) -> NumText:
    """The answer stating ``values``: with ``[NUM]`` tokens (RNED) or as plain text (baseline).

    Values are checked against ``[lo, hi]`` and snapped like :func:`to_num_text`; ``unit`` (if
    any) follows the last value after a space. ``num_tokens=True`` gives
    ``NumText("[NUM] x [NUM] mm", (32.5, 18.0))``, ``num_tokens=False`` gives
    ``NumText("32.5 x 18 mm", ())``; the plain text always reads back (:func:`to_num_text`) as
    the ``[NUM]`` text and values, else ``ValueError`` (e.g. an empty ``separator``).
    """
    if len(values) == 0:
        raise ValueError("values is empty; an answer states at least one value")
    d_lo, d_hi, d_step = _grid(lo, hi, step)
    grid = []
    for v in values:
        number = _Number(0, 0, repr(float(v)), _decimal(v), signed=False)
        _check_range(number, d_lo, d_hi)
        grid.append(_snap(number.value, d_step, number.literal))
    suffix = f" {unit}" if unit else ""
    plain = separator.join(_format(g) for g in grid) + suffix
    expected = (separator.join([NUM_TOKEN] * len(grid)) + suffix, tuple(float(g) for g in grid))
    try:
        read_back = astuple(to_num_text(plain, lo=lo, hi=hi, step=step))
    except ValueError:  # e.g. "3218" from an empty separator, or a [NUM] in the unit
        read_back = None
    if read_back != expected:
        raise ValueError(
            f"separator {separator!r} / unit {unit!r} change how the numbers read in "
            f"{plain!r}; use a separator such as ' x ' or ', ' and a unit without digits"
        )
    tokens = NumText(*expected)
    return tokens if num_tokens else NumText(plain, ())


def format_single(value_mm: float, *, num_tokens: bool, unit: str = "mm") -> NumText:
    """One measurement: ``"[NUM] mm"`` / ``"31 mm"``."""
    return answer_text([value_mm], num_tokens=num_tokens, unit=unit)


def format_dual(long_mm: float, short_mm: float, *, num_tokens: bool, unit: str = "mm") -> NumText:
    """Long and short axis: ``"[NUM] x [NUM] mm"`` / ``"32.5 x 18 mm"``; long first."""
    if long_mm < short_mm:
        raise ValueError(
            f"long axis {long_mm!r} is shorter than short axis {short_mm!r}; pass (long, short)"
        )
    return answer_text([long_mm, short_mm], num_tokens=num_tokens, unit=unit)


def format_box(
    box: Sequence[float], *, num_tokens: bool, lo: float = 0.0, hi: float = 3000.0
) -> NumText:
    """A box ``(x1, y1, x2, y2)``: ``"[[NUM], [NUM], [NUM], [NUM]]"`` / ``"[12, 40, 88, 101]"``."""
    if len(box) != 4:
        raise ValueError(f"a box has 4 coordinates (x1, y1, x2, y2), got {len(box)}")
    inner = answer_text(box, num_tokens=num_tokens, unit="", separator=", ", lo=lo, hi=hi)
    return NumText(f"[{inner.text}]", inner.values)


def _find_numbers(text: str) -> Iterator[_Number]:
    """The numbers of ``text`` in order, by the module's rules."""
    for word in _GLUED_WORD.finditer(text):
        spans = _number_spans(word.group())
        if spans is None:
            continue
        for index, (start, end) in enumerate(spans):
            start, end = word.start() + start, word.start() + end
            value = Decimal(text[start:end])
            signed = index == 0 and _has_sign(text, start)
            if signed:
                start, value = start - 1, value.copy_negate()
            yield _Number(start, end, text[start:end], value, signed)


def _number_spans(word: str) -> list[tuple[int, int]] | None:
    """Spans of the numbers of a numeric glued word, or ``None`` for an identifier."""
    spans: list[tuple[int, int]] = []
    position = 0
    while True:
        number = _NUMBER_UNIT.match(word, position)
        if number is None:
            return None
        spans.append(number.span(1))
        if number.end() == len(word):
            return spans
        separator = _SEPARATOR.match(word, number.end())
        if separator is None:
            return None
        position = separator.end()


def _has_sign(text: str, start: int) -> bool:
    """Whether the number at ``start`` carries a minus sign (see the module docstring)."""
    if start == 0 or text[start - 1] not in _MINUS:
        return False
    return start == 1 or _WORD_CHAR.match(text[start - 2]) is None


def _snap(value: Decimal, step: Decimal, literal: str) -> Decimal:
    """``value`` on the grid of ``step``, ties away from zero; exact, never via a float."""
    index = math.floor(Fraction(value.copy_abs()) / Fraction(step) + Fraction(1, 2))
    if index == 0:
        return Decimal(0)
    if index < 10**_FLOAT_DIGITS:
        grid = _CONTEXT.multiply(Decimal(index), step)
        if len(grid.normalize(_CONTEXT).as_tuple().digits) <= _FLOAT_DIGITS:
            return grid.copy_negate() if value < 0 else grid
    raise ValueError(
        f"value {_shorten(literal)} is not representable on the grid of step {_format(step)}: "
        f"grid values there need more than {_FLOAT_DIGITS} significant digits, more than a "
        "float64 holds exactly; use a coarser step or a smaller value"
    )


def _format(value: Decimal) -> str:
    """Fewest digits, no exponent: ``Decimal("32.50")`` -> ``"32.5"``, ``3E+3`` -> ``"3000"``."""
    if value == 0:
        return "0"
    return format(value.normalize(_CONTEXT), "f")


def _decimal(value: float) -> Decimal:
    """A finite float at its shortest ``repr`` (``0.15`` -> ``Decimal("0.15")``)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"value {value!r} is not finite; give a finite number")
    return Decimal(repr(number))


def _positive_step(step: float) -> Decimal:
    """``step`` as a positive, finite decimal."""
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"step must be a positive finite number, not {step!r}")
    return _decimal(step)


def _range(lo: float, hi: float) -> tuple[Decimal, Decimal]:
    """``lo`` and ``hi`` as decimals, checked finite and ordered."""
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"[lo, hi] must be finite with lo <= hi, not [{lo!r}, {hi!r}]")
    return _decimal(lo), _decimal(hi)


def _grid(lo: float, hi: float, step: float) -> tuple[Decimal, Decimal, Decimal]:
    """``lo``, ``hi``, ``step`` as decimals, checked to make a grid ``lo``, ``lo + step``, ..."""
    d_step = _positive_step(step)
    d_lo, d_hi = _range(lo, hi)
    for name, bound in (("lo", d_lo), ("hi", d_hi)):
        if (Fraction(bound) / Fraction(d_step)).denominator != 1:
            raise ValueError(
                f"{name}={_format(bound)} is not a multiple of step={_format(d_step)}; "
                "choose a range whose ends lie on the grid"
            )
    return d_lo, d_hi, d_step


def _check_range(number: _Number, lo: Decimal, hi: Decimal) -> None:
    """Raise ``ValueError`` naming the number and the range when it lies outside."""
    if not lo <= number.value <= hi:
        raise ValueError(
            _outside(number.literal, lo, hi) + "; values are never clamped: fix the text or "
            "widen lo / hi"
        )


def _outside(literal: str, lo: Decimal, hi: Decimal) -> str:
    return f"value {_shorten(literal)} outside [{_format(lo)}, {_format(hi)}]"


def _shorten(literal: str, limit: int = _MAX_SHOWN) -> str:
    """``literal``, cut in the middle when longer than ``limit`` characters."""
    if len(literal) <= limit:
        return literal
    half = (limit - 1) // 2
    return f"{literal[:half]}…{literal[-half:]}"
