"""The model on a CUDA GPU, where a site runs it (``pytest -m gpu``; ``benchmarks/gpu_check.sh``
runs these on a lent machine; deselected by the suite's ``-m "not gpu"`` everywhere else).

- the Circle-RoPE Qwen2.5-VL with the numeric head gives the CPU's logits and numbers in
  float32 on the GPU;
- training runs on the GPU (bfloat16 autocast) and its checkpoint measures there;
- the bundled demo model's clicked measurement in bfloat16 on the GPU agrees with the CPU's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ingestion.phantoms import generate_phantom, study_seed
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.checkpoint.weights import load_checkpoint
from model.measurer.data.sources import PhantomSource
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.inputs.data import collate, encode_example, phantom_examples, phantom_volume
from model.measurer.tasks.tokenizer import special_ids
from model.measurer.train.config import TrainConfig
from model.measurer.train.loop import train
from model.numeric.hf import NumericLM

pytestmark = pytest.mark.gpu


def test_the_demo_model_gives_the_cpus_logits_and_numbers_in_float32() -> None:
    torch.backends.cudnn.allow_tf32 = False  # the patch embedding's convolution, exactly
    torch.backends.cuda.matmul.allow_tf32 = False
    loaded = load_checkpoint(default_checkpoint())
    ids = special_ids(loaded.tokenizer)
    examples = phantom_examples(
        generate_phantom(study_seed(3, 0)),
        loaded.settings.measure_inputs,
        np.random.default_rng(0),
    )
    batch = collate([encode_example(e, loaded.tokenizer) for e in examples], ids["pad"])
    lm = NumericLM(loaded.model, loaded.head, ids["num"]).eval()
    args = (batch.input_ids, batch.attention_mask, batch.num_values)
    images = {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}
    with torch.no_grad():
        cpu = lm(*args, **images)
        lm.to("cuda")
        gpu = lm(*(a.cuda() for a in args), **{k: v.cuda() for k, v in images.items()})
    torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, atol=1e-4, rtol=1e-4)
    head = lm.numeric_head
    assert head is not None and gpu.num_hidden is not None and cpu.num_hidden is not None
    on_gpu = head.decode(gpu.num_hidden).cpu()
    lm.to("cpu")
    torch.testing.assert_close(
        on_gpu,
        head.decode(cpu.num_hidden),
        atol=1e-3,
        rtol=0.0,
    )


def test_training_on_the_gpu_gives_a_checkpoint_that_measures_there(tmp_path: Path) -> None:
    out = train(TrainConfig.tiny(), tmp_path / "run", PhantomSource(1), device="cuda")
    measurer = CheckpointMeasurer.load(out, device="cuda")
    assert next(measurer.lm.parameters()).device.type == "cuda"
    result = measurer.measure(phantom_volume(generate_phantom(study_seed(5, 0))), source="phantom")
    assert result.model.name == "radcaliper-demo" and result.model.not_for_clinical_use
    assert measurer.prompts_answered > 0


def test_a_clicked_measurement_in_bfloat16_agrees_with_the_cpu() -> None:
    phantom = generate_phantom(study_seed(2026, 1))
    volume = phantom_volume(phantom)
    lesions = [f for f in phantom.findings if f.kind == "lesion"]
    assert lesions
    cpu = CheckpointMeasurer.load(default_checkpoint(), device="cpu")
    gpu = CheckpointMeasurer.load(default_checkpoint(), device="cuda")
    compared = 0
    for lesion in lesions:
        a = cpu.measure_at(volume, lesion.center_lps_mm)
        b = gpu.measure_at(volume, lesion.center_lps_mm)
        assert (a is None) == (b is None), lesion
        if a is None or b is None:
            continue
        for x, y in zip(a.measurements, b.measurements, strict=True):
            assert (x.value_mm is None) == (y.value_mm is None), (x, y)
            if x.value_mm is not None and y.value_mm is not None:
                assert abs(x.value_mm - y.value_mm) <= 1.0, (x, y)
                compared += 1
    assert compared
