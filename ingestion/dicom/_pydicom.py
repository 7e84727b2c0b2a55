"""Reading through pydicom without its noise reaching the user.

pydicom reports what it dislikes in a file three ways: Python warnings, its own log records (a
decoder plugin that fails before another one succeeds logs the exception *with its traceback* at
ERROR), and value validation when a raw value is first read (a UID cut short, e.g.
``1.2.840.10008.``, warns then). None of this is a problem for radcaliper to show: a file that
cannot be used is rejected with a reason that names it, and a file that can is used.

- pydicom's log records (logger ``pydicom`` and its children) are passed on as DEBUG lines of
  ours: the message only, never a traceback, so ``-vv`` still shows e.g. which decoder failed.
- :func:`quiet_pydicom` runs a block with pydicom's warnings silenced and value validation off,
  and gathers what pydicom logged in it (in this thread) into one DEBUG line naming the block.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator

from pydicom import config

__all__ = ["quiet_pydicom"]

logger = logging.getLogger(__name__)

_PYDICOM_LOGGER = "pydicom"
_local = threading.local()  # .messages: the list the current block gathers into
_install_lock = threading.Lock()


class _Forward(logging.Handler):
    """pydicom's records, as our DEBUG lines (gathered by the block that runs, if any)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = f"{record.name}: {record.getMessage()}"
        gathered: list[str] | None = getattr(_local, "messages", None)
        if gathered is not None:
            gathered.append(message)
        else:
            logger.debug("pydicom said: %s", message)


def _install() -> None:
    source = logging.getLogger(_PYDICOM_LOGGER)
    with _install_lock:
        if not any(isinstance(h, _Forward) for h in source.handlers):
            source.addHandler(_Forward(logging.DEBUG))
            source.propagate = False


@contextlib.contextmanager
def quiet_pydicom(what: str) -> Iterator[None]:
    """Run the block with pydicom's warnings and value validation off; what pydicom logged in
    it becomes one DEBUG line prefixed with ``what`` (callers pass a file path: DEBUG only)."""
    _install()
    outer = getattr(_local, "messages", None)
    gathered: list[str] = []
    _local.messages = gathered
    try:
        with warnings.catch_warnings(), config.disable_value_validation():
            warnings.simplefilter("ignore")
            yield
    finally:
        _local.messages = outer
        if gathered:
            logger.debug("%s: pydicom said: %s", what, " | ".join(gathered))
