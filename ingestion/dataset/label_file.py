"""Label files: which label values of a label map (or segments of a DICOM SEG) are lesions and
which are vessels.

Accepted forms (:func:`read_label_file`): ``{"1": "lesion", "2": "vessel"}`` (roles);
``{"52": "aorta"}`` (names: ``VESSEL_NAMES``, TotalSegmentator's, and any name with the word
artery, vein, vena or vessel are vessels; ``LESION_NAMES`` make lesions);
``{"52": {"name": "aorta", "role": "target_vessel"}}`` (the ``label_map`` of
``shared/data/real-ct/cases.json``: roles lesion, vessel, target_vessel, other_vessel, organ,
background, ignore); or a Medical Segmentation Decathlon ``dataset.json`` (its ``"labels"``).
Names that are neither are ignored with a log line; a file that names no lesion and no vessel is
an error.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from ingestion.dataset.format import KindName
from ingestion.errors import ConfigurationError

__all__ = ["LESION_NAMES", "VESSEL_NAMES", "kind_of_name", "read_label_file"]

logger = logging.getLogger(__name__)

LESION_NAMES = frozenset(
    {"lesion", "tumor", "tumour", "cancer", "nodule", "gtv", "metastasis", "metastases", "mass"}
)
"""Label names (lower case, ``_``/``-``/space-separated words) that make a label a lesion: the
name is one of these or has one of them as a word ("liver_tumor", "GTV-1", "lung nodule")."""

VESSEL_NAMES = frozenset(
    {
        "aorta",
        "inferior_vena_cava",
        "superior_vena_cava",
        "portal_vein_and_splenic_vein",
        "portal_vein",
        "splenic_vein",
        "pulmonary_artery",
        "pulmonary_vein",
        "brachiocephalic_trunk",
        "brachiocephalic_vein_left",
        "brachiocephalic_vein_right",
        "common_carotid_artery_left",
        "common_carotid_artery_right",
        "subclavian_artery_left",
        "subclavian_artery_right",
        "iliac_artery_left",
        "iliac_artery_right",
        "iliac_vena_left",
        "iliac_vena_right",
        "hepatic_vessel",
        "vessel",
        "artery",
        "vein",
    }
)
"""Label names (TotalSegmentator's, lower case) that make a label a vessel; also any name with
the word "artery", "vein", "vena" or "vessel" in it."""

_VESSEL_WORDS = frozenset({"artery", "arteries", "vein", "veins", "vena", "vessel", "vessels"})
_ROLE_KIND: dict[str, KindName | None] = {
    "lesion": "lesion",
    "vessel": "vessel",
    "target_vessel": "vessel",
    "other_vessel": "vessel",
    "target": "vessel",
    "organ": None,
    "background": None,
    "ignore": None,
}


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def kind_of_name(name: str) -> KindName | None:
    """ "lesion", "vessel" or None (not known) for a label's name (``LESION_NAMES``,
    ``VESSEL_NAMES``)."""
    words = _words(name)
    if "_".join(words) in VESSEL_NAMES:
        return "vessel"
    if "_".join(words) in LESION_NAMES or any(w in LESION_NAMES for w in words):
        return "lesion"
    if any(w in _VESSEL_WORDS for w in words):
        return "vessel"
    return None


def _entry(path: Path, key: str, value: object) -> tuple[str, KindName | None, bool]:
    """(name, kind, known) of one label file entry; ``known`` is False for a name that is
    neither a role nor a known lesion or vessel name."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _ROLE_KIND:
            return value, _ROLE_KIND[word], True
        kind = kind_of_name(value)
        return value, kind, kind is not None
    if isinstance(value, Mapping):
        name = value.get("name", "")
        role = value.get("role")
        if not isinstance(name, str):
            raise ConfigurationError(f"{path}: label {key}: name must be text, got {name!r}")
        if role is None:
            kind = kind_of_name(name)
            return name, kind, kind is not None
        if not isinstance(role, str) or role.strip().lower() not in _ROLE_KIND:
            raise ConfigurationError(
                f"{path}: label {key}: unknown role {role!r}; use one of "
                f"{', '.join(sorted(_ROLE_KIND))}"
            )
        return name or role, _ROLE_KIND[role.strip().lower()], True
    raise ConfigurationError(
        f"{path}: label {key}: expected a name, a role or {{'name': ..., 'role': ...}}, "
        f"got {value!r}"
    )


def read_label_file(path: Path) -> dict[int, tuple[str, KindName]]:
    """Which label values are lesions and which are vessels, from a JSON label file.

    Accepted (label values as JSON keys):

    - roles: ``{"1": "lesion", "2": "vessel"}`` (also ``target_vessel``, ``other_vessel``;
      ``organ``, ``background`` and ``ignore`` are left out);
    - names and roles, as the shared real-CT ``cases.json`` writes them:
      ``{"52": {"name": "aorta", "role": "target_vessel"}}`` (a whole case with a
      ``"label_map"`` key is read too);
    - names: ``{"52": "aorta", "1": "liver_tumor"}``, classified by :func:`kind_of_name`;
    - a Medical Segmentation Decathlon ``dataset.json``: ``{"labels": {"0": "background",
      "1": "liver", "2": "cancer"}}`` (or its name -> value form).

    Names that are neither lesions nor vessels are left out with a log line.

    Returns:
        label value -> (name, "lesion" | "vessel").

    Raises:
        ConfigurationError: unreadable JSON, a key that is not a label value, an unknown role,
            or a file that names no lesion and no vessel.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"{path}: cannot read the label file ({error})") from error
    if isinstance(data, Mapping) and isinstance(data.get("label_map"), Mapping):
        data = data["label_map"]
    elif isinstance(data, Mapping) and isinstance(data.get("labels"), Mapping):
        data = data["labels"]
        if data and all(isinstance(v, int) for v in data.values()):  # {"liver": 1}: MSD v2
            data = {str(v): k for k, v in data.items()}
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"{path}: a label file is a JSON object of label values")
    roles: dict[int, tuple[str, KindName]] = {}
    for key, value in data.items():
        try:
            number = int(str(key).strip())
        except ValueError as error:
            raise ConfigurationError(
                f"{path}: {key!r} is not a label value (an integer); see read_label_file"
            ) from error
        name, kind, known = _entry(path, str(key), value)
        if not known:
            logger.info(
                "%s: label %d (%s): neither a lesion nor a vessel: ignored", path, number, name
            )
        if kind is not None and number != 0:
            roles[number] = (name, kind)
    if not roles:
        raise ConfigurationError(
            f"{path}: the label file names no lesion and no vessel label; give roles, e.g. "
            '{"1": "lesion", "2": "vessel"} or {"52": {"name": "aorta", "role": "target_vessel"}}'
        )
    return roles
