"""Progress for logs: long commands run from batch jobs and CI print plain lines, not a bar."""

import pytest

from app.progress import LineProgress


def test_progress_lines_every_five_percent_with_eta(capsys: pytest.CaptureFixture[str]) -> None:
    with LineProgress() as progress:
        task = progress.add_task("training", total=200, status="")
        for step in range(1, 201):
            progress.update(task, completed=step, status=f"loss {1 / step:.3f}")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 20  # one per 5 %, the last at 100 %
    assert lines[0].startswith("training: 10/200 (5 %), elapsed")
    assert "ETA" in lines[0] and lines[0].endswith("loss 0.100")
    assert lines[-1].startswith("training: 200/200 (100 %)")


def test_the_last_state_is_printed_when_the_work_stops_early(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with LineProgress() as progress:
        task = progress.add_task("calibrating", total=100, status="")
        progress.advance(task, 3)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("calibrating: 3/100 (3 %)")


def test_a_task_without_a_total_counts(capsys: pytest.CaptureFixture[str]) -> None:
    with LineProgress(every=100) as progress:
        task = progress.add_task("scanning files", total=None, status="")
        for count in range(1, 251):
            progress.update(task, completed=count)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "scanning files: 100",
        "scanning files: 200",
        "scanning files: 250",  # the last count when the work ends
    ]
    assert "ETA" not in lines[0] and "elapsed" in lines[0]
