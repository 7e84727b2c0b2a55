"""Progress for long commands: a live rich bar on a terminal, plain lines for logs otherwise
(batch jobs, CI), with the elapsed time and an ETA either way."""

from __future__ import annotations

import time
from typing import Any, Protocol, TypeVar

from app.console import err

__all__ = ["LineProgress", "ProgressDisplay", "StepLines", "progress_display", "steps_display"]

TaskKey = TypeVar("TaskKey")


class ProgressDisplay(Protocol[TaskKey]):
    """What :func:`progress_display` hands a command to draw on: rich's ``Progress`` (its
    tasks keyed by ``TaskID``) or :class:`LineProgress` (keyed by int)."""

    def add_task(self, description: str, *, total: int | None, status: str) -> TaskKey: ...

    def update(
        self,
        key: TaskKey,
        /,
        *,
        completed: int | None = None,
        status: str | None = None,
        total: int | None = None,
    ) -> None: ...


class LineProgress:
    """Progress for logs (stderr not a terminal): one line per 5 % or per minute with the
    step, the elapsed time and an ETA, instead of a live bar nobody sees. A task without a
    total (counting, e.g. files scanned) prints a line every ``every`` items or minute."""

    def __init__(self, every: int = 1000) -> None:
        self._tasks: dict[int, dict[str, Any]] = {}
        self._every = every

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        for task in self._tasks.values():
            self._line(task, force=True)

    def add_task(self, description: str, total: int | None, status: str = "") -> int:
        now = time.monotonic()
        key = len(self._tasks)
        self._tasks[key] = {
            "description": description,
            "total": None if total is None else max(1, int(total)),
            "completed": 0,
            "status": status,
            "start": now,
            "last_time": now,
            "last_done": 0,
        }
        return key

    def update(
        self,
        key: int,
        *,
        completed: int | None = None,
        status: str | None = None,
        total: int | None = None,
    ) -> None:
        task = self._tasks[key]
        if total is not None:
            task["total"] = max(1, int(total))
        if completed is not None:
            task["completed"] = completed
        if status is not None:
            task["status"] = status
        self._line(task)

    def advance(self, key: int, amount: int = 1) -> None:
        self.update(key, completed=self._tasks[key]["completed"] + amount)

    def _line(self, task: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        done, total, last = task["completed"], task["total"], task["last_done"]
        if done == last:
            return
        every = self._every if total is None else max(1, total // 20)
        if not (force or done // every > last // every or now - task["last_time"] >= 60):
            return
        elapsed = now - task["start"]
        if total is None:
            line = f"{task['description']}: {done}, elapsed {elapsed / 60:.1f} min"
        else:
            eta = elapsed / done * (total - done) if done > 0 else float("nan")
            line = (
                f"{task['description']}: {done}/{total} ({100 * done / total:.0f} %), "
                f"elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min"
            )
        err.print(f"{line} {task['status']}".rstrip(), markup=False, highlight=False)
        task["last_time"], task["last_done"] = now, done


def progress_display() -> Any:
    """A live progress bar on a terminal; plain progress lines otherwise."""
    if not err.is_terminal:
        return LineProgress()
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=err,
        transient=False,
    )


class StepLines:
    """Steps of a long job without a count (the first start's demo studies) as plain lines with
    the elapsed time, for logs (stderr not a terminal)."""

    def __init__(self, title: str) -> None:
        self._title = title
        self._start = time.monotonic()

    def __enter__(self) -> StepLines:
        self.update("started")
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.update("done")

    def update(self, text: str) -> None:
        elapsed = time.monotonic() - self._start
        err.print(f"{self._title}: {text} (elapsed {elapsed:.0f} s)", markup=False, highlight=False)


def steps_display(title: str) -> Any:
    """A spinner with the current step on a terminal; a plain line per step otherwise. Either
    has ``update(text)``."""
    if not err.is_terminal:
        return StepLines(title)
    return err.status(title)
