"""Small DICOM readings shared by the SR and SEG importers (``sr``, ``seg``): code values and
meanings, whether a code names a blood vessel, person names and content date/time as people
read them, and :class:`UnusableError`, the one error that turns an item into a Skipped line.

Kept apart so that each importer holds only its own format's reading. pydicom is imported
inside the functions that need it: importing this module reads nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingestion.errors import IngestionError

if TYPE_CHECKING:
    from pydicom import Dataset

__all__ = [
    "UnusableError",
    "code_meaning",
    "code_value",
    "content_time",
    "is_vessel_code",
    "person_name",
]

_VESSEL_WORDS = ("vessel", "artery", "aorta", "vein", "vena cava")  # not "aortic" (valve)


class UnusableError(IngestionError):
    """An item of an input that cannot be imported; the message is the Skipped line's reason.
    The importers turn it into a Skipped line: it never leaves them."""


def code_meaning(code: Any) -> str:
    """A code's meaning: a pydicom ``Code``'s ``meaning``, a code item's CodeMeaning, else the
    code as text."""
    return str(getattr(code, "meaning", None) or getattr(code, "CodeMeaning", "") or code)


def code_value(code: Dataset) -> str:
    """A code item's value (CodeValue, or the Long / URN code value of a longer code)."""
    for keyword in ("CodeValue", "LongCodeValue", "URNCodeValue"):
        if keyword in code:
            return str(code.get(keyword))
    return ""


def is_vessel_code(code: Any) -> bool:
    """Whether a code (finding type, site, segmented property) names a blood vessel: SCT Blood
    Vessel, Artery, Vein, Aorta, or a meaning with a vessel word (artery, vein, vena cava, ...)."""
    from pydicom.sr.codedict import codes

    vessels = (codes.SCT.BloodVessel, codes.SCT.Artery, codes.SCT.Vein, codes.SCT.Aorta)
    if any(code == c for c in vessels):
        return True
    meaning = code_meaning(code).lower()
    return any(word in meaning for word in _VESSEL_WORDS)


def person_name(value: Any) -> str:
    """A DICOM person name for people: "Jane Doe" for ``Doe^Jane``, "alice" for ``alice^``."""
    from pydicom.valuerep import PersonName

    name = value if isinstance(value, PersonName) else PersonName(str(value))
    parts = (name.name_prefix, name.given_name, name.middle_name, name.family_name)
    return " ".join(p for p in (*parts, name.name_suffix) if p) or str(value)


def content_time(dataset: Dataset) -> str | None:
    """The object's ContentDate / ContentTime as ISO 8601 (None without a date)."""
    date = str(dataset.get("ContentDate", "") or "")
    if len(date) != 8 or not date.isdigit():
        return None
    out = f"{date[:4]}-{date[4:6]}-{date[6:]}"
    time = str(dataset.get("ContentTime", "") or "")
    if len(time) >= 4 and time[:6].isdigit():
        seconds = time[4:6] if len(time) >= 6 else "00"
        out += f"T{time[:2]}:{time[2:4]}:{seconds}"
    return out
