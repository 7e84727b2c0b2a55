"""Training (model.measurer.train.loop): a few steps of the real tiny model on phantoms; the same
seed gives the same weights, an interrupted run resumes to exactly the uninterrupted result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ingestion.errors import ConfigurationError
from model.measurer.checkpoint.settings import SETTINGS_NAME
from model.measurer.checkpoint.weights import load_checkpoint
from model.measurer.data.sources import PhantomSource
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.infer.state import InferenceOptions, TraceEvent
from model.measurer.inputs.data import MeasureInputs
from model.measurer.inputs.find import FindInputs
from model.measurer.inputs.voting import FindVoting
from model.measurer.train.config import PoolSettings, Stage, StepReport, TrainConfig
from model.measurer.train.loop import train
from model.measurer.train.state import STATE_DIR

from tests.support.measurer import tiny_config

CONFIG = tiny_config(
    seed=3,
    stages=(Stage("a", 3, 1e-3, warmup_steps=1), Stage("b", 2, 1e-4, warmup_steps=1)),
    measure_batch=3,
    find_batch=2,
    point_batch=2,
    measure_inputs=MeasureInputs(
        pixel_mm=1.5, size=56, window=(40.0, 160.0), jitter_mm=2.0, jitter_z_mm=1.0
    ),
    pool=PoolSettings(
        size=3, initial=2, studies_per_step=0.5, planes_per_study=2, scoped_find_fraction=0.5
    ),
    find_prompts=(("lesion",), ("vessel",)),
    lambda_ramp_steps=2,
    checkpoint_every=2,
)


class Stop(Exception):
    pass


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors")) | {
        f"head.{k}": v for k, v in load_file(str(directory / "numeric_head.safetensors")).items()
    }


def test_config_round_trips_through_json() -> None:
    data = json.loads(json.dumps(CONFIG.to_json()))
    assert TrainConfig.from_json(data) == CONFIG
    assert CONFIG.total_steps == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stages": ()}, "at least one stage"),
        ({"measure_batch": 0, "find_batch": 0, "point_batch": 0}, "not all 0"),
        ({"find_prompts": ()}, "at least one prompt"),
        ({"find_prompts": (("lesion", "organ"),)}, "unknown finding kind 'organ'"),
    ],
)
def test_bad_configs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)
    with pytest.raises(ValueError, match="trainable"):
        Stage("x", 1, 1e-3, trainable="some")


def test_a_stage_overrides_the_batches_of_the_tasks_it_names() -> None:
    click = Stage("click", 4, 1e-4, batches={"point": 6, "find": 0})
    assert click.batches == (("find", 0), ("point", 6))  # sorted pairs, hashable and stored
    config = TrainConfig(**{**CONFIG.__dict__, "stages": (Stage("a", 1, 1e-3), click)})
    assert config.batches(config.stages[0]) == {"measure": 3, "find": 2, "point": 2, "axes": 1}
    assert config.batches(click) == {"measure": 3, "find": 0, "point": 6, "axes": 1}
    data = json.loads(json.dumps(config.to_json()))
    assert TrainConfig.from_json(data) == config
    # a hand-written config may give the batches as an object
    data["stages"][1]["batches"] = {"point": 6, "find": 0}
    assert TrainConfig.from_json(data) == config


@pytest.mark.parametrize(
    ("batches", "axes_batch", "message"),
    [
        ({"clicks": 4}, 1, "unknown task 'clicks'"),
        ({"point": -1}, 1, "batch of point must be >= 0"),
        ({"measure": 0, "find": 0, "point": 0, "axes": 0}, 1, "must not all be 0"),
        ({"axes": 2}, 0, "needs axes_batch > 0"),
    ],
)
def test_bad_stage_batches(batches: dict[str, int], axes_batch: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(stages=(Stage("s", 1, 1e-3, batches=batches),), axes_batch=axes_batch)


def test_a_stage_without_find_examples_trains_the_other_tasks(tmp_path: Path) -> None:
    config = TrainConfig(
        **{
            **CONFIG.__dict__,
            "stages": (
                Stage("all", 1, 1e-3, warmup_steps=1),
                Stage("click", 2, 1e-4, warmup_steps=1, batches={"find": 0, "point": 3}),
            ),
        }
    )
    reports: list[StepReport] = []
    train(config, tmp_path / "run", PhantomSource(1), on_step=reports.append)
    assert [r.stage for r in reports] == ["all", "click", "click"]
    assert reports[0].find_loss is not None
    for r in reports[1:]:
        assert r.find_loss is None and r.point_loss is not None
        assert r.measure_loss is not None and r.axes_loss is not None
        assert r.loss == pytest.approx(r.measure_loss + r.point_loss + r.axes_loss)


def test_training_is_deterministic_and_resumes_exactly(tmp_path: Path) -> None:
    reports: list[StepReport] = []
    whole = train(CONFIG, tmp_path / "whole", PhantomSource(1), on_step=reports.append)
    assert [r.step for r in reports] == [1, 2, 3, 4, 5]
    assert all(r.total == 5 and r.find_loss is not None for r in reports)
    for r in reports:
        assert r.measure_loss is not None and r.point_loss is not None
        assert r.axes_loss is not None
        assert r.loss == pytest.approx(r.measure_loss + r.find_loss + r.point_loss + r.axes_loss)
    assert [r.stage for r in reports] == ["a", "a", "a", "b", "b"]
    loaded = load_checkpoint(whole)
    assert loaded.settings.measure_inputs.jitter_mm == 0.0  # inference crops are not jittered
    assert loaded.settings.tasks == ("find", "measure", "point", "axes")
    assert loaded.settings.training["config"] == CONFIG.to_json()
    assert loaded.settings.find_prompts == (("lesion",), ("vessel",))  # what inference asks

    again = train(CONFIG, tmp_path / "again", PhantomSource(1))
    first, second = _weights(whole), _weights(again)
    assert all(torch.equal(first[k], second[k]) for k in first)

    def stop_at_three(report: StepReport) -> None:  # state saved at steps 2 and 3 (stage end)
        if report.step == 4:
            raise Stop

    with pytest.raises(Stop):
        train(CONFIG, tmp_path / "cut", PhantomSource(1), on_step=stop_at_three)
    state = json.loads((tmp_path / "cut" / STATE_DIR / "state.json").read_text())
    assert state["step"] == 3
    resumed: list[StepReport] = []
    train(CONFIG, tmp_path / "cut", PhantomSource(1), on_step=resumed.append)
    assert [r.step for r in resumed] == [4, 5]
    third = _weights(tmp_path / "cut")
    assert all(torch.equal(first[k], third[k]) for k in first)

    other = TrainConfig(**{**CONFIG.__dict__, "seed": 4})
    with pytest.raises(ConfigurationError, match="another configuration"):
        train(other, tmp_path / "cut", PhantomSource(1))
    assert (tmp_path / "cut" / SETTINGS_NAME).is_file()


def test_an_interrupted_stage_resumes_with_its_optimizer_state(tmp_path: Path) -> None:
    config = TrainConfig(**{**CONFIG.__dict__, "stages": (Stage("a", 4, 1e-3, warmup_steps=1),)})
    whole = train(config, tmp_path / "whole", PhantomSource(1))

    def stop_at_three(report: StepReport) -> None:  # state saved at step 2, mid-stage
        if report.step == 3:
            raise Stop

    with pytest.raises(Stop):
        train(config, tmp_path / "cut", PhantomSource(1), on_step=stop_at_three)
    train(config, tmp_path / "cut", PhantomSource(1))
    first, second = _weights(whole), _weights(tmp_path / "cut")
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_run_can_start_from_a_trained_checkpoint(tmp_path: Path) -> None:
    first = train(CONFIG, tmp_path / "first", PhantomSource(1))
    later = TrainConfig(
        **{**CONFIG.__dict__, "init_from": str(first), "stages": (Stage("none", 0, 1e-4),)}
    )
    second = train(later, tmp_path / "second", PhantomSource(1))
    a, b = _weights(first), _weights(second)
    assert all(torch.equal(a[k], b[k]) for k in a)
    xval = TrainConfig(**{**later.__dict__, "numeric_mode": "xval"})
    with pytest.raises(ConfigurationError, match="is a rned_corr model"):
        train(xval, tmp_path / "third", PhantomSource(1))


def test_a_model_with_3d_find_context_trains_and_measures(tmp_path: Path) -> None:
    """Find images of four frames (the plane, coordinates, the planes below and above) go
    through training and the checkpoint's find stage on the real tiny model."""
    config = tiny_config(
        find_inputs=FindInputs(pixel_mm=3.0, size=112, context_mm=4.0),
        stages=(Stage("a", 2, 1e-3, warmup_steps=1),),
    )
    reports: list[StepReport] = []
    train(config, tmp_path / "m", PhantomSource(1), on_step=reports.append)
    assert all(r.find_loss is not None and math.isfinite(r.find_loss) for r in reports)
    measurer = CheckpointMeasurer.load(
        tmp_path / "m", options=InferenceOptions(find_voting=FindVoting(), find_plane_mm=12.0)
    )
    assert measurer.settings.find_inputs.context_mm == 4.0
    frames: list[int] = []

    def seen(event: TraceEvent) -> None:
        frames.append(event.state.examined_planes)

    study = PhantomSource(1).study(0)
    result = measurer.measure(study.volume, source="phantom", trace=seen)
    assert frames[0] > 0  # the find stage examined planes with their context
    assert result.model.name == measurer.settings.name


def test_head_extra_reaches_the_numeric_head_and_round_trips() -> None:
    """``head_extra`` overrides the head's constructor options (the RND decoder's p ablation
    of benchmarks/bench_rned.py) and is stored with the configuration."""
    from model.measurer.checkpoint.settings import NumericMode
    from model.measurer.checkpoint.weights import build_head

    config = TrainConfig.tiny(numeric_mode=NumericMode.RNED_RND, head_extra={"p": 0.5})
    options = config.head_options()
    assert options["p"] == 0.5 and options["hi"] == config.number_hi
    head = build_head(config.numeric_mode, 64, options)
    assert head.codec.p == 0.5  # type: ignore[union-attr]
    assert TrainConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    xval = TrainConfig.tiny(numeric_mode=NumericMode.XVAL, head_extra={"hi": 50.0})
    assert xval.head_options() == {"lo": 0.0, "hi": 50.0}
