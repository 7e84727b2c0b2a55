"""``radcaliper evaluate --dataset DIR --task click``: the clicked measurement against radiologists.

For every lesion of the dataset's chosen side of the patient split (``ingestion.dataset.split``)
that has its mask and readers' reads (``dataset import --from reads``), each measurer is asked
``measure_at`` at a click inside the lesion on its largest slice, at two more random clicks
inside it, and at a click in the lung at least 5 mm outside it
(``model.measurer.evaluate.clicks``), on the already loaded volume (what it answers is timed,
not the loading). Scored by ``model.measurer.evaluate.click_scores`` for the model and, beside
it on every run, for the classical click-seeded segmentation (``model.baseline``), the yardstick
any model must beat.

Writes ``click_evaluation.json`` (figures and per-lesion answers of each measurer, with the
cases and patients they are of: owner-only), ``click_evaluation.md`` (the tables, no case or
patient named) and plots per measurer (``bland_altman_NAME.png``,
``predicted_vs_true.png``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from app.report import JSONValue
    from ingestion.dataset.format import Dataset, DatasetFinding
    from ingestion.dataset.split import Side
    from ingestion.volume import Volume
    from model.measurer.evaluate.click_scores import ClickAnswer, ClickCase, ClickScores
    from model.measurer.results import ModelInfo, StudyFinding

__all__ = [
    "ClickEvaluation",
    "ClickMeasurer",
    "click_markdown",
    "evaluate_clicks",
    "write_click_outputs",
]

logger = logging.getLogger(__name__)

EXTRA_CLICKS = 2


class ClickMeasurer(Protocol):
    """What answers a click: the model (``Measurer``) or the baseline."""

    @property
    def info(self) -> ModelInfo: ...

    def measure_at(
        self, volume: Volume, point_lps_mm: tuple[float, float, float]
    ) -> StudyFinding | None: ...


@dataclass(frozen=True)
class ClickEvaluation:
    """Each measurer's scores on the same lesions and clicks."""

    scores: dict[str, ClickScores]  # by the measurer's label
    models: dict[str, dict[str, JSONValue]]
    dataset: str
    sides: tuple[str, ...]
    lesions: int
    skipped: tuple[str, ...]  # lesions that could not be clicked, with the reason
    seconds: float
    seed: int

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "dataset": self.dataset,
            "sides": list(self.sides),
            "seed": self.seed,
            "lesions": self.lesions,
            "skipped": list(self.skipped),
            "seconds": round(self.seconds, 1),
            "measurers": {
                label: {
                    "model": self.models[label],
                    "summary": scores.to_json(),
                    "cases": [c.to_json() for c in scores.cases],
                }
                for label, scores in self.scores.items()
            },
        }


def _rng(seed: int, key: str) -> np.random.Generator:
    """A generator of its own for each lesion: the clicks do not depend on the order or on
    the other lesions of the run."""
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _answer(measurer: ClickMeasurer, volume: Volume, point: Sequence[float]) -> ClickAnswer:
    from ingestion.errors import RadcaliperError
    from model.measurer.evaluate.click_scores import ClickAnswer

    began = time.perf_counter()
    try:
        finding = measurer.measure_at(volume, (float(point[0]), float(point[1]), float(point[2])))
    except RadcaliperError as exc:  # refused or malformed: nothing measured, said why
        logger.info("%s: nothing measured at a click: %s", measurer.info.name, exc)
        finding = None
    return ClickAnswer.of(finding, time.perf_counter() - began)


@dataclass(frozen=True)
class _Target:
    finding: DatasetFinding
    patient: str
    primary: tuple[float, float, float]
    extra: tuple[tuple[float, float, float], ...]
    outside: tuple[float, float, float] | None


def _targets(
    dataset: Dataset, series_uid: str, volume: Volume, seed: int, skipped: list[str]
) -> list[_Target]:
    from ingestion.dataset.masks import finding_mask
    from ingestion.errors import RadcaliperError
    from model.measurer.evaluate.clicks import lesion_clicks, negative_click

    study = dataset.study(series_uid)
    out = []
    for finding in dataset.findings_of(series_uid):
        if finding.kind != "lesion" or finding.long_axis_mm is None or not finding.reads:
            continue  # the click scoreboard scores lesions against their readers
        name = f"finding {finding.id}"  # not its case name: that may name the patient
        if finding.mask is None:
            skipped.append(f"{name}: no mask to place a click in")
            continue
        try:
            mask = finding_mask(dataset.root, finding, volume)
        except RadcaliperError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if not mask.any():
            skipped.append(f"{name}: its mask is empty on the image's grid")
            continue
        rng = _rng(seed, finding.id)
        clicks = lesion_clicks(mask, volume.geometry, extra=EXTRA_CLICKS, rng=rng)
        outside = negative_click(volume.voxels, mask, volume.geometry, rng=rng)
        out.append(
            _Target(
                finding,
                study.patient_id or series_uid,
                clicks.primary_lps_mm,
                clicks.extra_lps_mm,
                outside,
            )
        )
    return out


def _case(
    target: _Target,
    primary: ClickAnswer,
    extra: Sequence[ClickAnswer],
    outside: ClickAnswer | None,
) -> ClickCase:
    from model.measurer.evaluate.click_scores import ClickCase

    finding = target.finding
    assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
    return ClickCase(
        case=finding.name or finding.id,
        patient=target.patient,
        truth_long_mm=finding.long_axis_mm,
        truth_short_mm=finding.short_axis_mm,
        reads=tuple((r.long_axis_mm, r.short_axis_mm) for r in finding.reads),
        answer=primary,
        extra=tuple(extra),
        outside=outside,
    )


def evaluate_clicks(
    measurers: Mapping[str, ClickMeasurer],
    dataset: Dataset,
    sides: Sequence[Side],
    *,
    seed: int = 0,
    on_series: Callable[[int, int], None] | None = None,
) -> ClickEvaluation:
    """Every measurer at the same clicks of every lesion of ``sides`` (module doc).

    Raises:
        ConfigurationError: no lesion of those sides has reads and a mask to click in.
    """
    from ingestion.dataset.split import select_side
    from ingestion.errors import ConfigurationError, RadcaliperError
    from model.measurer.data.sources import load_dataset_volume
    from model.measurer.evaluate.click_scores import score_clicks

    began = time.monotonic()
    chosen = select_side(dataset, sides)
    series = chosen.series()
    cases: dict[str, list[ClickCase]] = {label: [] for label in measurers}
    warmed: set[str] = set()
    skipped: list[str] = []
    for done, series_uid in enumerate(series):
        if on_series is not None:
            on_series(done, len(series))
        try:
            volume = load_dataset_volume(chosen, series_uid)
        except RadcaliperError as exc:
            skipped.append(f"{series_uid}: {exc}")
            continue
        targets = _targets(chosen, series_uid, volume, seed, skipped)
        for label, measurer in measurers.items():
            if targets and label not in warmed:  # the first call loads lazily: not timed
                _answer(measurer, volume, targets[0].primary)
                warmed.add(label)
            for target in targets:
                cases[label].append(
                    _case(
                        target,
                        _answer(measurer, volume, target.primary),
                        [_answer(measurer, volume, p) for p in target.extra],
                        None
                        if target.outside is None
                        else _answer(measurer, volume, target.outside),
                    )
                )
    if on_series is not None:
        on_series(len(series), len(series))
    lesions = len(next(iter(cases.values()), []))
    if not lesions:
        raise ConfigurationError(
            f"{dataset.root}: no lesion on the {', '.join(sides)} side(s) has readers' reads "
            "and a mask to click in (import readers' reads with 'radcaliper dataset import "
            "SOURCE OUT --from reads')"
        )
    return ClickEvaluation(
        scores={label: score_clicks(c) for label, c in cases.items()},
        models={label: m.info.to_json() for label, m in measurers.items()},
        dataset=str(dataset.root),
        sides=tuple(str(s) for s in sides),
        lesions=lesions,
        skipped=tuple(skipped),
        seconds=time.monotonic() - began,
        seed=seed,
    )


def _mm(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole}" if whole else "-"


def _coverage(scores: ClickScores) -> str:
    long = scores.overall.long
    if not long.coverage_n:
        return "- (no ranges)"
    low, high = long.coverage_interval
    return f"{long.coverage:.2f} [{low:.2f}, {high:.2f}] (n={long.coverage_n})"


def click_markdown(evaluation: ClickEvaluation, header: Sequence[str] = ()) -> str:
    """The scoreboard as markdown: one column per measurer, then per size bin with n."""
    labels = list(evaluation.scores)
    s = evaluation.scores
    lines = [f"### Clicked measurement against the readers ({', '.join(evaluation.sides)})", ""]
    lines += list(header) + ([""] if header else [])
    lines += [
        f"{evaluation.lesions} lesions; truth = the readers' median; LOO = each reader left out "
        "in turn, against the median of the others (the readers' own MAE on the same rows).",
        "",
        "| figure | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    rows: list[tuple[str, Callable[[ClickScores], str]]] = [
        ("measured", lambda x: _share(x.overall.measured, x.overall.n)),
        ("long axis MAE (mm)", lambda x: _mm(x.overall.long.mae_mm)),
        ("long axis bias (mm)", lambda x: _mm(x.overall.long.bias_mm)),
        ("short axis MAE (mm)", lambda x: _mm(x.overall.short.mae_mm)),
        ("short axis bias (mm)", lambda x: _mm(x.overall.short.bias_mm)),
        ("long axis MAE, LOO (mm)", lambda x: _mm(x.overall.long.loo_mae_mm)),
        ("readers' long MAE, LOO, same rows", lambda x: _mm(x.overall.long.readers_loo_mae_mm)),
        ("short axis MAE, LOO (mm)", lambda x: _mm(x.overall.short.loo_mae_mm)),
        ("readers' short MAE, LOO, same rows", lambda x: _mm(x.overall.short.readers_loo_mae_mm)),
        ("90 % range coverage, long [95 % CI]", _coverage),
        ("nothing here: measured / clicks", lambda x: _share(x.outside_measured, x.outside_n)),
        (
            "three clicks: long-axis MAD (mm), n",
            lambda x: f"{_mm(x.three_click_mad_mm)} (n={x.three_click_n})",
        ),
        ("seconds per click (median)", lambda x: f"{x.seconds_median:.3f}"),
    ]
    lines += [f"| {name} | " + " | ".join(f(s[k]) for k in labels) + " |" for name, f in rows]
    lines += [
        "",
        "| size bin | n | " + " | ".join(f"{k}: measured, long MAE, short MAE" for k in labels)
        + " | readers' long MAE (LOO) |",
        "|---|---|" + "---|" * (len(labels) + 1),
    ]  # fmt: skip
    first = s[labels[0]]
    for name in first.bins:
        cells = [
            f"{_share(s[k].bins[name].measured, s[k].bins[name].n)}, "
            f"{_mm(s[k].bins[name].long.mae_mm)}, {_mm(s[k].bins[name].short.mae_mm)}"
            for k in labels
        ]
        readers = _mm(first.bins[name].long.readers_loo_mae_mm)
        lines.append(f"| {name} | {first.bins[name].n} | " + " | ".join(cells) + f" | {readers} |")
    if evaluation.skipped:
        lines += ["", f"Skipped ({len(evaluation.skipped)}): " + "; ".join(evaluation.skipped[:5])]
    return "\n".join(lines) + "\n"


def _items(scores: ClickScores) -> list[object]:
    from model.measurer.evaluate.metrics import NumericItem

    out: list[object] = []
    for c in scores.cases:
        a = c.answer
        predicted = None
        if a.measured and a.long_mm is not None and a.short_mm is not None:
            predicted = (a.long_mm, a.short_mm)
        out.append(NumericItem(c.case, "lesion", (c.truth_long_mm, c.truth_short_mm), predicted))
    return out


def write_click_outputs(
    evaluation: ClickEvaluation, out_dir: Path, header: Sequence[str] = ()
) -> str:
    """Write the JSON, the markdown and the plots into ``out_dir``; returns the markdown."""
    from app.evaluation.plots import bland_altman, predicted_vs_true
    from app.files import private_file
    from model.measurer.evaluate.comparison import json_safe

    out_dir.mkdir(parents=True, exist_ok=True)
    # per lesion rows name cases and patients (a site's own patients): the owner's only
    with private_file(out_dir / "click_evaluation.json") as sink:
        rows = json.dumps(
            json_safe(evaluation.to_json()), indent=1, sort_keys=True, allow_nan=False
        )
        sink.write((rows + "\n").encode())
    text = click_markdown(evaluation, header)
    (out_dir / "click_evaluation.md").write_text(text)
    for label, scores in evaluation.scores.items():
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
        bland_altman(_items(scores), out_dir / f"bland_altman_{safe}.png", f"{label} vs readers")
    predicted_vs_true(
        {label: _items(scores) for label, scores in evaluation.scores.items()},
        out_dir / "predicted_vs_true.png",
        "Clicked lesions: predicted vs the readers' median",
    )
    return text
