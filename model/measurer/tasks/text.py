"""The task language of the default measurer: prompt and answer texts, and their parsers.

Images travel as placeholders that the caller inserts; this module writes only the text parts and
reads answers back. Pure Python, no torch.

Templates
---------
==========  =======================================  ============================================
task        prompt                                   answers
==========  =======================================  ============================================
find        ``find lesions and vessels in the         ``lesion slice 3 box [12, 40, 88, 101] ;
            images`` (``image`` when K = 1)           vessel slice 5 box [60, 20, 90.5, 52] ; end``
                                                     or ``none``
measure     ``measure the lesion``                   ``32.5 x 18 mm`` (long x short)
            ``measure the vessel``                   ``31 mm`` (diameter)
point       ``measure at the point``                 ``lesion 32.5 x 18 mm``, ``vessel 31 mm``,
                                                     ``none``
==========  =======================================  ============================================

A find prompt comes with K slice images; an answer's ``slice`` is the 0-based index of one of
those K images and its ``box`` is ``[row0, col0, row1, col1]`` in pixels of that image (top-left
inclusive, bottom-right exclusive, ``row0 < row1``, ``col0 < col1``). With one image (K = 1,
the default model's per-plane prompts) the slice is left out: ``lesion box [12, 40, 88, 101] ;
end``. Findings are written in the order given (the caller picks a canonical order for
training targets), joined by `` ; `` and followed by `` ; end``. Numbers are written
canonically on the 0.1 grid of ``model.numeric.text`` (``18``, ``32.5``), slice indices as whole
numbers, values in ``[0, 3000]``; every writer raises ``ValueError`` rather than write a text
its parser rejects.

Numeric modes
-------------
Standard tokens: the answers above are the texts. RNED: ``to_num_text(answer)`` gives the text
with one ``[NUM]`` per number (``lesion slice [NUM] box [[NUM], [NUM], [NUM], [NUM]] ; end``) and
the values; after generation, :func:`with_values` turns the ``[NUM]`` text and the decoded
values back into plain text for the parsers.

Parsing
-------
The parsers never raise on model output. As in the RNED paper (``model.numeric.text``), an
answer succeeds iff it holds exactly the expected count of numbers, each in ``[0, 3000]``: per
finding one slice index and four box numbers, two for a lesion, one for a vessel, none for
``none``. Malformed output is reported, never patched: a failure carries a reason naming what was
wrong (``"finding 2 of 3 (vessel): box: found 3 numbers, expected 4"``). A find answer fails as
a whole when any finding fails (wrong count, unknown kind, a slice index that is not whole or not
among the images, a box with ``row0 >= row1`` or ``col0 >= col1``, no final ``end``); the
findings read before the bad one are kept for diagnostics only. Measured values are returned as
written: ``"18 x 32 mm"`` parses with values ``(18.0, 32.0)`` and the caller sorts if it wants
``(long, short)``. Case is ignored, and so are Qwen-style special tokens (``<|im_end|>``) at the
end of an answer.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from model.measurer.results import FindingKind
from model.numeric.text import (
    format_box,
    format_dual,
    format_single,
    from_num_text,
    parse_values,
)

__all__ = [
    "NONE_WORD",
    "FoundFinding",
    "MeasureAnswer",
    "ParsedFind",
    "ParsedMeasure",
    "ParsedPoint",
    "find_answer",
    "find_kinds",
    "find_prompt",
    "measure_answer",
    "measure_prompt",
    "parse_find",
    "parse_measure",
    "parse_point",
    "point_answer",
    "point_prompt",
    "with_values",
]

_Box = tuple[float, float, float, float]

NONE_WORD = "none"  # the whole answer when there is nothing (a point, a find plane)
_NONE = NONE_WORD
_END = "end"
_SEPARATOR = ";"
_MAX_VALUE = 3000.0  # the range every number of the task language is written and read in
_COUNT = {FindingKind.LESION: 2, FindingKind.VESSEL: 1}
_KIND_VALUES = frozenset(kind.value for kind in FindingKind)
_KINDS = ", ".join(kind.value for kind in FindingKind)

_TRAILING_SPECIALS = re.compile(r"(?:\s*<\|[a-z_]+\|>)+\s*$")
_FIRST_WORD = re.compile(r"\s*([^\W\d_]+)\b(.*)", re.DOTALL)
_FINDING = re.compile(
    r"(?P<kind>\S+)\s+slice\b(?P<slice>.*?)\bbox\b(?P<box>.*)", re.IGNORECASE | re.DOTALL
)
_SINGLE_IMAGE_FINDING = re.compile(r"(?P<kind>\S+)\s+box\b(?P<box>.*)", re.IGNORECASE | re.DOTALL)


# --- records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoundFinding:
    """One finding of a find answer: its kind, slice (0-based, among the K images) and box.

    ``box`` is ``(row0, col0, row1, col1)`` in pixels, top-left inclusive and bottom-right
    exclusive, finite, >= 0, with ``row0 < row1`` and ``col0 < col1``; checked on construction.
    """

    kind: FindingKind
    slice_index: int
    box: _Box

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _kind(self.kind))
        object.__setattr__(self, "slice_index", _slice_index(self.slice_index))
        object.__setattr__(self, "box", _box(self.box))


@dataclass(frozen=True, slots=True)
class MeasureAnswer:
    """What a measure answer states: ``(long, short)`` for a lesion, ``(diameter,)`` for a vessel.

    Checked on construction: the count for the kind, finite values >= 0, ``long >= short``.
    """

    kind: FindingKind
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        kind = _kind(self.kind)
        values = tuple(float(v) for v in self.values)
        if len(values) != _COUNT[kind]:
            shape = "(long, short)" if kind is FindingKind.LESION else "(diameter,)"
            raise ValueError(
                f"a {kind} measurement has {_COUNT[kind]} value(s), got {len(values)} "
                f"({values!r}); pass {shape}"
            )
        for v in values:
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"measured value {v!r} is not a finite length >= 0 mm")
        if kind is FindingKind.LESION and values[0] < values[1]:
            raise ValueError(
                f"long axis {values[0]!r} is shorter than short axis {values[1]!r}; "
                "pass (long, short)"
            )
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True, slots=True)
class ParsedFind:
    """What :func:`parse_find` read. On failure ``findings`` holds the well-formed findings
    before the bad one, for diagnostics only; ``reason`` is ``None`` exactly on success."""

    findings: tuple[FoundFinding, ...]
    success: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        _check_reason(self.success, self.reason)


@dataclass(frozen=True, slots=True)
class ParsedMeasure:
    """What :func:`parse_measure` read: the numbers found, as written (use them on success)."""

    values: tuple[float, ...]
    success: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        _check_reason(self.success, self.reason)


@dataclass(frozen=True, slots=True)
class ParsedPoint:
    """What :func:`parse_point` read: ``kind`` is ``None`` for ``none`` (and on failures
    without a kind); values as written (use them on success)."""

    kind: FindingKind | None
    values: tuple[float, ...]
    success: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        _check_reason(self.success, self.reason)


# --- writers --------------------------------------------------------------------------------


def find_prompt(num_images: int, kinds: Collection[FindingKind | str] | None = None) -> str:
    """The find prompt for ``num_images`` slice images (their placeholders are added elsewhere),
    asking for ``kinds`` (default: both).

    A prompt for one kind lets a study annotated exhaustively for that kind only (e.g. a real
    background whose vessels nobody labelled) teach "nothing here" for that kind.

    >>> find_prompt(8)
    'find lesions and vessels in the images'
    >>> find_prompt(1, ["lesion"])
    'find lesions in the image'
    """
    if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
        raise ValueError(f"num_images must be a positive int, not {num_images!r}")
    asked = find_kinds(kinds)
    words = " and ".join(f"{kind.value}s" for kind in FindingKind if kind in asked)
    return f"find {words} in the " + ("image" if num_images == 1 else "images")


def find_kinds(kinds: Collection[FindingKind | str] | None) -> frozenset[FindingKind]:
    """``kinds`` as a non-empty set of ``FindingKind`` (None: both); ValueError naming a kind
    that is not one."""
    if kinds is None:
        return frozenset(FindingKind)
    out = set()
    for kind in kinds:
        try:
            out.add(FindingKind(kind))
        except ValueError:
            raise ValueError(
                f"unknown finding kind {kind!r}; use {[k.value for k in FindingKind]}"
            ) from None
    if not out:
        raise ValueError("a find prompt asks for at least one kind")
    return frozenset(out)


def find_answer(findings: Sequence[FoundFinding], *, num_images: int | None = None) -> str:
    """The find answer stating ``findings`` in the order given; ``"none"`` when empty.

    For a one-image prompt (``num_images=1``) the slice is left out: ``"lesion box [...]"``.

    >>> find_answer([FoundFinding(FindingKind.LESION, 3, (12, 40, 88, 101))])
    'lesion slice 3 box [12, 40, 88, 101] ; end'
    >>> find_answer([FoundFinding(FindingKind.VESSEL, 0, (1, 2, 3, 4))], num_images=1)
    'vessel box [1, 2, 3, 4] ; end'
    """
    if not findings:
        return _NONE
    items = []
    for finding in findings:
        if not isinstance(finding, FoundFinding):
            raise ValueError(f"findings must be FoundFinding objects, not {finding!r}")
        _check_writable(finding.box, "box coordinate")
        box = format_box(finding.box, num_tokens=False, hi=_MAX_VALUE).text
        if num_images == 1:
            if finding.slice_index != 0:
                raise ValueError(
                    f"slice_index {finding.slice_index} in a one-image answer; it must be 0"
                )
            items.append(f"{finding.kind.value} box {box}")
        else:
            items.append(f"{finding.kind.value} slice {finding.slice_index} box {box}")
    text = f" {_SEPARATOR} ".join([*items, _END])
    parsed = parse_find(text, num_images=num_images)
    if not parsed.success:  # e.g. a box that collapses on the 0.1 grid, a slice index > 3000
        raise ValueError(f"cannot write these findings: {parsed.reason}")
    return text


def measure_prompt(kind: FindingKind | str) -> str:
    """``"measure the lesion"`` / ``"measure the vessel"``."""
    return f"measure the {_kind(kind).value}"


def measure_answer(kind: FindingKind | str, values: Sequence[float]) -> str:
    """``"32.5 x 18 mm"`` for a lesion ``(long, short)``, ``"31 mm"`` for a vessel ``(d,)``.

    Values are snapped to the 0.1 grid and written canonically; raises ``ValueError`` for a wrong
    count, a negative or non-finite value, ``long < short`` or a value above 3000.
    """
    answer = MeasureAnswer(_kind(kind), tuple(values))
    _check_writable(answer.values, "measured value (mm)")
    if answer.kind is FindingKind.LESION:
        long_mm, short_mm = answer.values
        return format_dual(long_mm, short_mm, num_tokens=False).text
    return format_single(answer.values[0], num_tokens=False).text


def point_prompt() -> str:
    """The prompt of a measurement at a clicked point (marked on the image elsewhere)."""
    return "measure at the point"


def point_answer(kind: FindingKind | str | None, values: Sequence[float] = ()) -> str:
    """``"lesion 32.5 x 18 mm"``, ``"vessel 31 mm"``, or ``"none"`` (``kind=None``, no values)."""
    if kind is None:
        if len(values) != 0:
            raise ValueError(f"a 'none' point answer states no values, got {tuple(values)!r}")
        return _NONE
    checked = _kind(kind)
    return f"{checked.value} {measure_answer(checked, values)}"


def with_values(num_text: str, values: Sequence[float]) -> str:
    """A generated ``[NUM]`` text with its decoded values as plain text, ready to parse.

    ``from_num_text``: values snapped to the 0.1 grid and written canonically; raises
    ``ValueError`` when the counts of ``[NUM]`` tokens and values differ.

    >>> with_values("lesion [NUM] x [NUM] mm", [32.47, 18.0])
    'lesion 32.5 x 18 mm'
    """
    return from_num_text(num_text, values)


# --- parsers --------------------------------------------------------------------------------


def parse_find(text: str, *, num_images: int | None = None) -> ParsedFind:
    """Read a find answer; with ``num_images`` each slice index must be below it.

    Never raises on ``text``. Succeeds for ``"none"`` (no findings) or findings
    ``"<kind> slice <index> box [row0, col0, row1, col1]"`` each followed by ``;``, then
    ``end``; any bad finding fails the whole answer, with the reason. With ``num_images=1`` the
    findings are ``"<kind> box [...]"`` (slice 0; a ``slice`` is malformed there).
    """
    body = _strip_specials(text)
    if not body:
        return ParsedFind((), False, "empty answer")
    if body.lower() == _NONE:
        return ParsedFind((), True)
    items = [item.strip() for item in body.split(_SEPARATOR)]
    if items[-1].lower() != _END:
        if any(item.lower() == _END for item in items):
            return ParsedFind((), False, f"text after {_END!r}: {_quote(body)}")
        return ParsedFind(
            (), False, f"no {_END!r} after the last finding (cut short?): {_quote(body)}"
        )
    items = items[:-1]
    if not items:
        return ParsedFind((), False, f"{_END!r} without findings; an empty answer is {_NONE!r}")
    found: list[FoundFinding] = []
    for number, item in enumerate(items, start=1):
        finding = _parse_finding(item, num_images)
        if isinstance(finding, str):
            where = f"finding {number} of {len(items)}"
            return ParsedFind(tuple(found), False, f"{where}{finding}")
        found.append(finding)
    return ParsedFind(tuple(found), True)


def parse_measure(text: str, kind: FindingKind | str) -> ParsedMeasure:
    """Read a measure answer: two numbers for a lesion, one for a vessel, as written.

    Never raises on ``text`` (only for an unknown ``kind``). ``"18 x 32 mm"`` gives
    ``(18.0, 32.0)``: sort for ``(long, short)``.
    """
    checked = _kind(kind)
    parsed = parse_values(_strip_specials(text), _COUNT[checked], hi=_MAX_VALUE)
    reason = None if parsed.success else f"{checked.value}: {parsed.reason}"
    return ParsedMeasure(parsed.values, parsed.success, reason)


def parse_point(text: str) -> ParsedPoint:
    """Read a point answer: ``"<kind> <values> mm"`` or ``"none"``; never raises."""
    body = _strip_specials(text)
    if not body:
        return ParsedPoint(None, (), False, "empty answer")
    match = _FIRST_WORD.fullmatch(body)
    if match is None:
        return ParsedPoint(
            None, (), False, f"answer does not start with {_KINDS} or {_NONE}: {_quote(body)}"
        )
    raw, rest = match.group(1), match.group(2)
    word = raw.lower()
    if word == _NONE:
        parsed = parse_values(rest, 1, hi=_MAX_VALUE)  # only to collect the numbers
        if parsed.values:
            return ParsedPoint(None, parsed.values, False, f"{_NONE!r} followed by numbers")
        return ParsedPoint(None, (), True)
    if word not in _COUNT:
        return ParsedPoint(
            None, (), False, f"unknown kind {_quote(raw)}; expected {_KINDS} or {_NONE}"
        )
    kind = FindingKind(word)
    parsed = parse_values(rest, _COUNT[kind], hi=_MAX_VALUE)
    reason = None if parsed.success else f"{kind.value}: {parsed.reason}"
    return ParsedPoint(kind, parsed.values, parsed.success, reason)


def _parse_finding(item: str, num_images: int | None) -> FoundFinding | str:
    """One finding of a find answer, or the reason it is malformed (to follow "finding i")."""
    if not item:
        return " is empty"
    single = num_images == 1
    match = (_SINGLE_IMAGE_FINDING if single else _FINDING).fullmatch(item)
    if match is None or (single and re.search(r"\bslice\b", item, re.IGNORECASE)):
        form = "<kind> box" if single else "<kind> slice <index> box"
        return f": expected '{form} [row0, col0, row1, col1]', got {_quote(item)}"
    word = match.group("kind").lower()
    if word not in _COUNT:
        return f": unknown kind {_quote(match.group('kind'))}; expected {_KINDS}"
    where = f" ({word})"
    value = 0.0
    if not single:
        index = parse_values(match.group("slice"), 1, hi=_MAX_VALUE)
        if not index.success:
            return f"{where}: slice: {index.reason}"
        (value,) = index.values
        if not value.is_integer():
            return f"{where}: slice index {value:g} is not a whole number"
        if num_images is not None and value >= num_images:
            return f"{where}: slice index {value:g} is not among the {num_images} images"
    box = parse_values(match.group("box"), 4, hi=_MAX_VALUE)
    if not box.success:
        return f"{where}: box: {box.reason}"
    row0, col0, row1, col1 = box.values
    for name, lo, hi in (("row", row0, row1), ("col", col0, col1)):
        if lo >= hi:
            return (
                f"{where}: box {_box_text(box.values)} has {name}0 >= {name}1; expected "
                "[row0, col0, row1, col1] with row0 < row1 and col0 < col1"
            )
    return FoundFinding(FindingKind(word), int(value), (row0, col0, row1, col1))


# --- checks and helpers ---------------------------------------------------------------------


def _kind(kind: object) -> FindingKind:
    """``kind`` as a FindingKind, or ``ValueError`` naming it and the kinds."""
    if isinstance(kind, str) and kind in _KIND_VALUES:
        return FindingKind(kind)
    raise ValueError(f"unknown finding kind {kind!r}; use one of {_KINDS}")


def _slice_index(value: object) -> int:
    """A slice index: an int >= 0 (not a bool, not a float)."""
    try:
        index = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        index = -1
    if isinstance(value, bool) or index < 0:
        raise ValueError(
            f"slice_index must be an int >= 0 (0-based among the images), not {value!r}"
        )
    return index


def _box(box: object) -> _Box:
    """A box ``(row0, col0, row1, col1)`` of finite floats >= 0 with row0 < row1, col0 < col1."""
    try:
        values = tuple(float(v) for v in box)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        values = ()
    if len(values) != 4 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(
            f"box must be 4 finite pixel coordinates >= 0 (row0, col0, row1, col1), not {box!r}"
        )
    row0, col0, row1, col1 = values
    if not (row0 < row1 and col0 < col1):
        raise ValueError(
            f"box {values!r} needs row0 < row1 and col0 < col1 (top-left inclusive, "
            "bottom-right exclusive); swap the corners"
        )
    return row0, col0, row1, col1


def _check_reason(success: bool, reason: str | None) -> None:
    """Parsed results: ``reason`` is ``None`` exactly when ``success``."""
    if success == (reason is not None):
        raise ValueError(
            "a successful parse has reason=None and a failed one needs a reason; "
            f"got success={success}, reason={reason!r}"
        )


def _check_writable(values: Sequence[float], what: str) -> None:
    """``ValueError`` for a value above the largest number the task language writes."""
    for v in values:
        if v > _MAX_VALUE:
            raise ValueError(
                f"{what} {v:g} is above {_MAX_VALUE:g}, the largest number the task language "
                "writes; rescale the image or check the value"
            )


def _strip_specials(text: str) -> str:
    """``text`` without surrounding whitespace and trailing ``<|...|>`` special tokens."""
    return _TRAILING_SPECIALS.sub("", text).strip()


def _box_text(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _quote(text: str, limit: int = 60) -> str:
    """``repr`` of ``text``, cut when longer than ``limit`` characters."""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
