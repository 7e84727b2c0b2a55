"""Benchmark: a model on the real development set (`../shared/data/real-ct/`, issue 22), through
the command line a site would use.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_real.py [--data ../shared/data/real-ct] [--model DIR]
                                    [--work DIR] [--cases ID,...]
                                    [--results-md benchmarks/RESULTS.md]

1. Imports every case of ``cases.json`` with ``radcaliper dataset import LABELS DATASET --from
   masks --image INPUT --labels LABEL_FILE --modality M --annotator A --licence L``: the case's
   image as published (its ``input``: a DICOM series or a NIfTI file), its ``labels.nii.gz`` and
   its ``label_map`` (which labels are lesions and vessels) written as the label file. A case
   whose image cannot be imported (the series with blank UIDs) is listed with the reason.
2. Runs ``radcaliper evaluate --dataset DATASET [--model DIR] --out WORK/evaluation``: recall per
   kind and size, false findings per study, MAE and Bland-Altman, coverage, parse success,
   seconds per study (the demo model by default).
3. Checks each case against what ``cases.json`` expects of it (measured, or refused and why),
   prints the tables and, with ``--results-md``, writes them between the ``bench_real`` markers
   of that file with the command, date, machine and model.

Run it alone: it times the model. The cases and their licences are described in the data
folder's README; two are non-commercial (develop and evaluate only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import load, machine

BEGIN = "<!-- bench_real: begin -->"
END = "<!-- bench_real: end -->"
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "real-ct"
RADCALIPER = Path(sys.executable).parent / "radcaliper"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RADCALIPER), *args], capture_output=True, text=True, check=False, timeout=3600
    )


def import_cases(
    data: Path, dataset: Path, work: Path, ids: set[str] | None
) -> tuple[list[str], dict[str, str]]:
    """Import the chosen cases with the CLI; returns a markdown table of what happened and,
    per case that gave no series, why."""
    cases = json.loads((data / "cases.json").read_text())["cases"]
    (work / "labels").mkdir(parents=True, exist_ok=True)
    lines = ["| case | exit | imported | skipped |", "|---|---|---|---|"]
    not_imported: dict[str, str] = {}
    for case in cases:
        if ids is not None and case["id"] not in ids:
            continue
        label_file = work / "labels" / f"{case['id']}.json"
        label_file.write_text(json.dumps(case["label_map"], indent=1))
        folder = data / Path(case["input"]).parts[0]  # the case's files (shared by _asis)
        began = time.perf_counter()
        done = _run(
            [
                *("dataset", "import", str(folder / case.get("labels", "labels.nii.gz"))),
                *(str(dataset), "--from", "masks", "--image", str(data / case["input"])),
                *("--labels", str(label_file), "--modality", case["modality"]),
                *("--annotator", case.get("annotation", "unknown")[:100]),
                *("--licence", case["source"].get("licence", "unknown")),
            ]
        )
        said = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        skipped = [line.strip() for line in done.stderr.splitlines() if "skipped" in line]
        print(f"{case['id']} (exit {done.returncode}, {time.perf_counter() - began:.1f} s)")
        for line in said + skipped:
            print(f"  {line}")
        summary = said[-1].split(" from ")[0] if said else done.stderr.strip()[-200:]
        if done.returncode == 2 or "Imported 0 series" in summary:
            not_imported[case["id"]] = "; ".join(skipped) or summary
        lines.append(
            f"| {case['id']} | {done.returncode} | {summary.replace('|', '/')} | "
            f"{'; '.join(s.replace('|', '/')[:200] for s in skipped) or '-'} |"
        )
    return lines, not_imported


def expectations(
    data: Path, evaluation: dict[str, object], not_imported: dict[str, str]
) -> list[str]:
    """Each case's outcome next to what cases.json expects of it (a case that could not be
    imported was refused at the door)."""
    cases = json.loads((data / "cases.json").read_text())["cases"]
    by_image = {str((data / c["input"]).resolve()): c for c in cases}
    lines = [
        "| case | expected | outcome | as expected | found / true | reported (false) |",
        "|---|---|---|---|---|---|",
    ]
    for case_id, reason in sorted(not_imported.items()):
        expect = next(c["expect"] for c in cases if c["id"] == case_id)
        lines.append(
            f"| {case_id} | {expect} | not imported ({reason.replace('|', '/')[:140]}) | "
            f"{'yes' if expect == 'refuse' else 'NO'} | - | - |"
        )
    studies = evaluation["studies"]
    assert isinstance(studies, list)
    for study in studies:
        case = by_image.get(str(Path(study["image"]).resolve()))
        if case is None:
            continue
        outcome = "refused" if study["refused"] else "measured"
        reason = f" ({study['error']})" if study["refused"] and study["error"] else ""
        lines.append(
            f"| {case['id']} | {case['expect']} | {outcome}{reason[:140]} | "
            f"{'yes' if outcome.startswith(case['expect'][:6]) else 'NO'} | "
            f"{study['found']} / {study['true_findings']} | "
            f"{study['reported']} ({study['false_findings']}) |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--cases", default=None, help="Comma-separated case ids (default all).")
    parser.add_argument("--results-md", type=Path, default=None)
    args = parser.parse_args()
    if not (args.data / "cases.json").is_file():
        sys.exit(f"{args.data}: no cases.json; pass --data ../shared/data/real-ct")
    ids = None if args.cases is None else {c.strip() for c in args.cases.split(",")}
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        dataset = work / "dataset"
        imports, not_imported = import_cases(args.data, dataset, work, ids)
        began = time.perf_counter()
        model = ["--model", str(args.model)] if args.model else []
        done = _run(["evaluate", "--dataset", str(dataset), *model, "--out", str(work / "eval")])
        minutes = (time.perf_counter() - began) / 60
        if done.returncode != 0:
            sys.exit(f"radcaliper evaluate failed ({done.returncode}):\n{done.stderr[-2000:]}")
        evaluation = json.loads((work / "eval" / "evaluation.json").read_text())
        table = (work / "eval" / "evaluation.md").read_text()
    command = " ".join(["python benchmarks/bench_real.py", *sys.argv[1:]])
    text = "\n".join(
        [
            f"- command: `{command}` (runs `radcaliper dataset import` per case, then "
            "`radcaliper evaluate --dataset`)",
            f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; evaluate took {minutes:.1f} min "
            "(model load included)",
            f"- machine: {machine()}; load {load()}",
            f"- data: `{args.data}`",
            "",
            "Import (`radcaliper dataset import ... --from masks`):",
            "",
            *imports,
            "",
            "Each case against `cases.json`'s expectation:",
            "",
            *expectations(args.data, evaluation, not_imported),
            "",
            "`radcaliper evaluate --dataset` (its `evaluation.md`):",
            "",
            table.strip(),
            "",
        ]
    )
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
