"""What a client checks before it hands a command over: the code it runs (a resident serves only
clients running its own sources) and, in the quick hand-off of ``app.cli.main``, the data dir and
the command, without loading the command line's libraries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.cli import handed_to_resident
from app.resident.client import environment_data_dir
from app.resident.protocol import code_fingerprint, source_files
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_the_fingerprint_covers_every_source_file() -> None:
    files = set(source_files())
    for name in ("app/resident/protocol.py", "app/cli/measure.py", "model/measurer/results.py",
                 "db/store.py", "ingestion/load.py"):  # fmt: skip
        assert (ROOT / name).resolve() in files, name


def test_a_changed_source_changes_the_fingerprint() -> None:
    path = ROOT / "app" / "cli" / "points.py"
    before, stat = code_fingerprint(), path.stat()
    try:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        assert code_fingerprint() != before
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert code_fingerprint() == before


@pytest.mark.parametrize(
    "environ",
    [{}, {"RADCALIPER_DATA_DIR": "/srv/rc"}, {"radcaliper_data_dir": "/srv/lower"}],
    ids=["default", "set", "any case"],
)
def test_the_data_dir_is_the_settings(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.upper() == "RADCALIPER_DATA_DIR"]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert environment_data_dir(os.environ) == Settings().data_dir


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["inspect", "x"],
        ["--version"],
        ["measure", "x", "--help"],
        ["measure", "x", "--no-resident"],
        ["measure", "x", "--at", "1,2"],
        ["measure", "x", "--at", "nan,1,2"],
        ["measure", "x", "--at=1,2,a"],
        ["measure", "x", "--at"],
        ["measure", "x", *["--at", "1,2,3"] * 101],
    ],
)
def test_what_the_quick_hand_off_leaves_to_the_command_line(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADCALIPER_DATA_DIR", str(tmp_path))
    assert handed_to_resident(argv) is None  # the command line runs (and says what is wrong)


def test_no_resident_means_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADCALIPER_DATA_DIR", str(tmp_path))
    assert handed_to_resident(["-v", "measure", "x", "--at", "1, 2, 3"]) is None


def test_a_resident_keeps_a_study_until_a_file_of_it_changes(tmp_path: Path) -> None:
    from app.resident import KeptVolumes, keeping_models

    study = tmp_path / "study"
    study.mkdir()
    (study / "a.dcm").write_bytes(b"one")
    loads: list[int] = []

    def load() -> list[int]:
        loads.append(1)
        return [len(loads)]

    kept: KeptVolumes[list[int]] = KeptVolumes(lambda v: 10)
    assert kept.get(study, "", load) == [1] and kept.get(study, "", load) == [2]  # not kept
    with keeping_models():
        first = kept.get(study, "", load)
        assert kept.get(study, "", load) is first  # the same study: not read again
        assert kept.get(study, "CT", load) is not first  # read another way: its own
        (study / "b.dcm").write_bytes(b"two")  # a file more: read again
        again = kept.get(study, "", load)
        assert again is not first and kept.get(study, "", load) is again
        others = [tmp_path / f"s{i}" for i in range(5)]
        for other in others:
            other.mkdir()
            (other / "x").write_bytes(b"x")
            kept.get(other, "", load)
        before = len(loads)
        kept.get(study, "", load)  # pushed out by the four studies used since
        assert len(loads) == before + 1
    with keeping_models():  # forgotten when the resident stops keeping
        kept.get(study, "", load)
        assert len(loads) == before + 2


def test_a_resident_keeps_no_more_voxels_than_its_budget(tmp_path: Path) -> None:
    from app.resident import KeptVolumes, keeping_models

    big = KeptVolumes[list[int]](lambda v: 800 << 20)  # 800 MiB each: one fits the budget
    studies = []
    for i in range(2):
        (tmp_path / f"s{i}").mkdir()
        (tmp_path / f"s{i}" / "x").write_bytes(b"x")
        studies.append(tmp_path / f"s{i}")
    loads: list[int] = []
    with keeping_models():
        for study in (*studies, studies[0]):
            big.get(study, "", lambda: loads.append(1) or [len(loads)])  # type: ignore[func-returns-value]
    assert len(loads) == 3  # the first was let go for the second


def test_a_data_dir_others_may_write_is_left_to_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick hand-off asks no resident of a data dir others may change (a socket there
    could be anyone's); the command then refuses it, saying why."""
    from typer.testing import CliRunner

    from app.cli import app

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("RADCALIPER_DATA_DIR", str(shared))
    assert handed_to_resident(["measure", "x", "--at", "1,2,3"]) is None
    done = CliRunner().invoke(app, ["measure", "x", "--at", "1,2,3"])
    assert done.exit_code == 2 and "data dir" in done.output
