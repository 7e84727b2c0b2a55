"""Calibrating a click model's ranges on held-out patients' reads.

The click model (``model.measurer.infer.click``) is asked at the clicks the click evaluation
makes (``model.measurer.evaluate.clicks.lesion_clicks``: the deepest point of the largest
section and random points inside the lesion) on every lesion of the calibration side of the
patient split; its long and short axis against the readers' medians give the held-out pairs.
Ranges are split conformal per measurement and, within it, per size bin of the predicted value
(``fit_binned_calibration``, Mondrian): small nodules and large masses do not share one width.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ingestion.dataset.format import Dataset
from ingestion.errors import ConfigurationError
from model.measurer.calibrate.calibration import (
    DEFAULT_COVERAGE,
    Calibration,
    fit_binned_calibration,
)
from model.measurer.infer.click import ClickCaliper
from model.measurer.results import MeasurementName

__all__ = ["CLICK_BIN_EDGES_MM", "ClickPairs", "click_pairs", "fit_click_calibration"]

logger = logging.getLogger(__name__)

#: inner edges of the size bins (predicted value, mm) the click model's ranges are fitted in
CLICK_BIN_EDGES_MM = (6.0, 10.0, 20.0)


@dataclass(frozen=True)
class ClickPairs:
    """Held-out (name, predicted, true) pairs and how many clicks gave none."""

    pairs: tuple[tuple[str, float, float], ...]
    clicks: int
    unanswered: int


def click_pairs(
    caliper: ClickCaliper,
    dataset: Dataset,
    *,
    extra: int = 2,
    seed: int = 0,
    on_lesion: Callable[[int, int], None] | None = None,
) -> ClickPairs:
    """The caliper's long and short axes at each lesion's clicks against the readers' medians
    (``dataset``: the side to calibrate on, chosen by the caller)."""
    from ingestion.dataset.masks import finding_mask
    from model.measurer.data.sources import load_dataset_volume
    from model.measurer.evaluate.clicks import lesion_clicks

    findings = [
        f
        for f in dataset.findings
        if f.kind == "lesion" and f.mask is not None and f.long_axis_mm is not None
    ]
    if not findings:
        raise ConfigurationError(
            f"{dataset.root}: no lesion with a mask and reads to calibrate on; import reads "
            "with 'radcaliper dataset import DIR OUT --from reads'"
        )
    pairs: list[tuple[str, float, float]] = []
    clicks = unanswered = 0
    for done, finding in enumerate(findings):
        if on_lesion is not None:
            on_lesion(done, len(findings))
        volume = load_dataset_volume(dataset, finding.series_instance_uid)
        mask = finding_mask(dataset.root, finding, volume)
        rng = np.random.default_rng([seed, done])
        points = lesion_clicks(mask, volume.geometry, extra=extra, rng=rng)
        truth = {
            MeasurementName.LONG_AXIS: float(finding.long_axis_mm or 0.0),
            MeasurementName.SHORT_AXIS: float(finding.short_axis_mm or 0.0),
        }
        for point in (points.primary_lps_mm, *points.extra_lps_mm):
            clicks += 1
            found = caliper.measure_at(volume, point)
            values = {} if found is None else {m.name: m.value_mm for m in found.measurements}
            if not values or any(v is None for v in values.values()):
                unanswered += 1
                continue
            for name, true in truth.items():
                predicted = values[name]
                assert predicted is not None
                pairs.append((name.value, predicted, true))
    return ClickPairs(tuple(pairs), clicks, unanswered)


def fit_click_calibration(
    pairs: Sequence[tuple[str, float, float]], coverage: float = DEFAULT_COVERAGE
) -> Calibration:
    """Ranges per measurement and size bin (:data:`CLICK_BIN_EDGES_MM`) from held-out pairs."""
    return fit_binned_calibration(pairs, CLICK_BIN_EDGES_MM, coverage)
