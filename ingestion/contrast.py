"""Whether a study was acquired with a contrast agent, as its DICOM header records it.

:func:`contrast_of` reads one header of the volume's source files (pixel data deferred) and
answers from what the header *states*, never from free text or from the image:

- ``CONTRAST``: positive evidence of an agent: ContrastBolusAgent (0018,0010) names one (any
  text other than a negation below: Siemens writes "APPLIED", GE "GASTRO & OMNI"), the
  ContrastBolusAgentSequence (0018,0012) has an item, ContrastBolusRoute (0018,1040) names a
  route, ContrastBolusVolume (0018,1041) or ContrastBolusTotalDose (0018,1044) is > 0, or an
  enhanced object's Contrast/Bolus Usage Sequence (0018,9341, shared or per-frame functional
  groups) says ContrastBolusAgentAdministered (0018,9342) YES. Oral contrast counts: the header
  rarely tells oral from intravenous in a way that can be relied on.
- ``NON_CONTRAST``: only an explicit statement and no positive evidence: ContrastBolusAgent
  written as a negation (:data:`NEGATIONS`: "NONE", "NO", "NO CONTRAST", "NON-CONTRAST",
  "WITHOUT CONTRAST", "NATIVE", ...), or a usage item says Administered NO and none YES.
- ``UNKNOWN``: everything else. The Contrast/Bolus module is conditional ("required if contrast
  media were used") but often left out when an agent was given: LUNG1-001's ProtocolName reads
  "RCCTPET_THORAX_CONTRAST" and its header has no contrast tag, so an absent module is no proof
  of a plain study. ContrastBolusAgent present but empty is DICOM type 2's "unknown", not "none";
  a volume of 0 is no proof either (the TotalSegmentator abdomen, contrast-enhanced by its aorta
  at about 150 HU, says agent "APPLIED", volume "0"). Contradicting statements (a negation and
  a route), unreadable files, and NIfTI, NRRD and synthetic volumes (no header) are UNKNOWN too.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ingestion.errors import IngestionError
from ingestion.volume import SourceFormat, Volume

if TYPE_CHECKING:  # pydicom is imported by the functions that read a header
    from pydicom.dataset import Dataset

__all__ = ["NEGATIONS", "Contrast", "contrast_of", "contrast_of_dataset"]

logger = logging.getLogger(__name__)

# ContrastBolusAgent values that state "no agent" (upper case, single spaces)
NEGATIONS = frozenset(
    {
        "NONE",
        "NO",
        "NO CONTRAST",
        "NON CONTRAST",
        "NON-CONTRAST",
        "NONCONTRAST",
        "WITHOUT CONTRAST",
        "W/O CONTRAST",
        "NATIVE",
    }
)


class Contrast(enum.StrEnum):
    """What a study's header says about a contrast agent (module doc)."""

    CONTRAST = "contrast"
    NON_CONTRAST = "non-contrast"
    UNKNOWN = "unknown"


def contrast_of(volume: Volume) -> Contrast:
    """What ``volume``'s first source file records about a contrast agent (module doc).

    Never raises for a file: one that cannot be read any more answers UNKNOWN (logged).
    """
    if volume.source_format is not SourceFormat.DICOM:
        return Contrast.UNKNOWN
    from ingestion.dicom.header import read_dicom_header

    path = volume.sources[0]
    try:
        ds = read_dicom_header(path)
    except IngestionError as error:
        logger.warning("contrast unknown: %s", error)
        return Contrast.UNKNOWN
    return contrast_of_dataset(ds)


def _normal(text: str) -> str:
    return " ".join(text.upper().split())


def _positive_number(item: Dataset, keyword: str) -> bool:
    from ingestion.dicom._header_values import raw_text

    try:
        return float(raw_text(item, keyword).split("\\")[0]) > 0
    except ValueError:
        return False


def _usage_items(ds: Dataset) -> Iterator[Dataset]:
    for groups in ("SharedFunctionalGroupsSequence", "PerFrameFunctionalGroupsSequence"):
        for group in ds.get(groups) or ():
            yield from group.get("ContrastBolusUsageSequence") or ()


def contrast_of_dataset(ds: Dataset) -> Contrast:
    """What one DICOM header records about a contrast agent (module doc)."""
    from ingestion.dicom._header_values import raw_text

    agent = _normal(raw_text(ds, "ContrastBolusAgent"))
    route = _normal(raw_text(ds, "ContrastBolusRoute"))
    positive = [
        bool(agent) and agent not in NEGATIONS,
        bool(ds.get("ContrastBolusAgentSequence")),
        bool(route) and route not in NEGATIONS,
        _positive_number(ds, "ContrastBolusVolume"),
        _positive_number(ds, "ContrastBolusTotalDose"),
    ]
    negative = [agent in NEGATIONS]
    for item in _usage_items(ds):
        administered = _normal(raw_text(item, "ContrastBolusAgentAdministered"))
        positive.append(administered == "YES")
        negative.append(administered == "NO")
    if any(positive) and any(negative):
        logger.debug("contrast unknown: the header states both an agent and none (%r)", agent)
        return Contrast.UNKNOWN
    if any(positive):
        return Contrast.CONTRAST
    if any(negative):
        return Contrast.NON_CONTRAST
    return Contrast.UNKNOWN
