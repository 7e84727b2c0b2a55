"""Start-up in proportion to the work (issue 26): ``--help`` of every command and every
``audit`` command import neither torch, transformers nor MONAI; ``radcaliper --help`` not even
pydantic-settings. Checked in a fresh interpreter, by the modules it holds at the end, not by
time (the timings are benchmarks/bench_startup.py's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[3]
MODEL_LIBRARIES = ("torch", "transformers", "monai")

# Runs each command line of argv[2] (a JSON list of argument lists) in this interpreter, its
# output discarded, and writes every exit status and the heavy modules then loaded to argv[1].
_RUN = """
import contextlib, io, json, sys

from app.cli import main

result, commands = sys.argv[1], json.loads(sys.argv[2])
statuses = []
for args in commands:
    sys.argv = ["radcaliper", *args]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main()
            statuses.append(0)
        except SystemExit as exit:
            statuses.append(exit.code or 0)
heavy = ("torch", "transformers", "monai", "pydantic_settings", "sqlalchemy")
loaded = sorted(name for name in heavy if name in sys.modules)
with open(result, "w") as out:
    json.dump({"statuses": statuses, "loaded": loaded}, out)
"""


def _run(tmp_path: Path, commands: list[list[str]]) -> dict[str, Any]:
    result = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADCALIPER_")}
    env["RADCALIPER_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(result), json.dumps(commands)],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(result.read_text())
    return answer


def _command_paths() -> list[list[str]]:
    """Every command and group of the command line, as the words that name it."""
    import typer

    from app.cli import app

    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:  # typer's own click: duck-typed
        paths.append(path)
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_the_root_help_loads_no_settings_library(tmp_path: Path) -> None:
    done = _run(tmp_path, [["--help"]])
    assert done == {"statuses": [0], "loaded": []}


def test_every_commands_help_loads_no_model_library(tmp_path: Path) -> None:
    paths = _command_paths()
    assert ["measure"] in paths and ["audit", "measurements"] in paths and len(paths) > 20
    done = _run(tmp_path, [[*path, "--help"] for path in paths])
    assert done["statuses"] == [0] * len(paths)
    assert not set(done["loaded"]) & set(MODEL_LIBRARIES), done["loaded"]


def test_the_audit_commands_load_no_model_library(tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'fresh.sqlite3'}"]
    commands = [
        ["db", "upgrade", *db],
        ["audit", "measurements", *db],
        ["audit", "measurements", "--format", "json", "--patient", "P1", *db],
        ["audit", "log", *db],
        ["audit", "verify", *db],
    ]
    done = _run(tmp_path, commands)
    assert done["statuses"] == [0] * len(commands)
    assert "sqlalchemy" in done["loaded"]  # the commands did run
    assert not set(done["loaded"]) & set(MODEL_LIBRARIES), done["loaded"]
