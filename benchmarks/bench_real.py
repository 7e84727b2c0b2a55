"""Benchmark: a model on the real development set (`../shared/data/real-ct/`, issue 22).

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_real.py [--data ../shared/data/real-ct] [--model DIR]
                                    [--work DIR] [--threads 2] [--cases ID,...]
                                    [--results-md benchmarks/RESULTS.md]

1. Imports every case of ``cases.json`` with the label-map importer (``radcaliper dataset import
   --from masks``): the case's image as published (its ``input``: a DICOM series or a NIfTI
   file), its ``labels.nii.gz`` and its ``label_map`` (which labels are lesions and vessels),
   with the case's annotator and licence. A case whose image cannot be imported (e.g. the
   series with blank UIDs) is listed with the reason.
2. Evaluates the model (default: the bundled demo) on the dataset with ``radcaliper evaluate
   --dataset``'s code: recall per kind and size, false findings per study, MAE and
   Bland-Altman, coverage, parse success, seconds per study; each case is named by its id and
   what ``cases.json`` expects of it (measure, or refuse and why).
3. Prints the tables and, with ``--results-md``, writes them between the ``bench_real``
   markers of that file (command, date, machine and model in the header).

The cases and their licences are described in the data folder's README; two are
non-commercial (develop and evaluate only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine

from app.dataset_eval import evaluate_dataset, write_outputs
from ingestion.dataset.format import ImportResult, write_import
from ingestion.dataset.masks import import_masks
from ingestion.errors import RadcaliperError
from model.measurer.checkpoint import default_checkpoint
from model.measurer.pipeline import CheckpointMeasurer

BEGIN = "<!-- bench_real: begin -->"
END = "<!-- bench_real: end -->"
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "real-ct"


def import_cases(
    data: Path, work: Path, ids: set[str] | None
) -> tuple[list[ImportResult], dict[str, str]]:
    """Import the chosen cases; returns the results and, per series UID, the case's label."""
    cases = json.loads((data / "cases.json").read_text())["cases"]
    results: list[ImportResult] = []
    names: dict[str, str] = {}
    (work / "labels").mkdir(parents=True, exist_ok=True)
    for case in cases:
        if ids is not None and case["id"] not in ids:
            continue
        label_file = work / "labels" / f"{case['id']}.json"
        label_file.write_text(json.dumps(case["label_map"], indent=1))
        folder = data / Path(case["input"]).parts[0]  # the case's files (shared by _asis)
        began = time.perf_counter()
        try:
            result = import_masks(
                folder / case.get("labels", "labels.nii.gz"),
                image=data / case["input"],
                label_file=label_file,
                annotator=case.get("annotation", "unknown")[:120],
                licence=case["source"].get("licence", "unknown"),
                modality=case["modality"],
            )
        except RadcaliperError as error:
            print(f"{case['id']}: not imported: {error}")
            continue
        expect = case["expect"] + (
            f" ({case['expect_reason']})" if case.get("expect_reason") else ""
        )
        for study in result.studies:
            names[study.series_instance_uid] = f"{case['id']} [expect {expect}]"
        kinds = ", ".join(f"{f.kind} {f.name}" for f in result.findings) or "no finding"
        print(
            f"{case['id']}: {len(result.studies)} series, {kinds}; "
            f"{len(result.skipped)} skipped ({time.perf_counter() - began:.1f} s)"
        )
        for skipped in result.skipped:
            print(f"  skipped {skipped.line()}")
        results.append(result)
    return results, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", default=None, help="Comma-separated case ids (default all).")
    parser.add_argument("--results-md", type=Path, default=None)
    args = parser.parse_args()
    if not (args.data / "cases.json").is_file():
        sys.exit(f"{args.data}: no cases.json; pass --data ../shared/data/real-ct")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    ids = None if args.cases is None else {c.strip() for c in args.cases.split(",")}
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        dataset = work / "dataset"
        results, names = import_cases(args.data, work, ids)
        write_import(dataset, results)
        model = CheckpointMeasurer.load(args.model or default_checkpoint())
        began = time.perf_counter()
        result = evaluate_dataset(
            model,
            dataset,
            names=lambda uid, path: names.get(uid, path),
            on_study=lambda o: print(f"  measured {o.name} ({o.seconds:.1f} s)", flush=True),
        )
        minutes = (time.perf_counter() - began) / 60
        not_imported = [
            f"- not in the dataset: {s.line()}" for r in results for s in r.skipped if not r.studies
        ]
        header = [
            f"- command: `python benchmarks/bench_real.py {' '.join(sys.argv[1:])}`".replace(
                "  ", " "
            ),
            f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; evaluation {minutes:.1f} min",
            f"- machine: {machine()}; load {load()}",
            f"- data: `{args.data}` ({len(names)} series imported from {len(results)} cases)",
            *not_imported,
        ]
        text = write_outputs(result, work / "evaluation", header)
    print(text)
    if args.results_md is not None:
        old = args.results_md.read_text() if args.results_md.is_file() else ""
        block = f"{BEGIN}\n{text}{END}\n"
        if BEGIN in old and END in old:
            head, rest = old.split(BEGIN, 1)
            tail = rest.split(END, 1)[1].lstrip("\n")
            args.results_md.write_text(head + block + tail)
        else:
            args.results_md.write_text(old.rstrip("\n") + "\n\n" + block)


if __name__ == "__main__":
    main()
