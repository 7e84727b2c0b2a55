"""What a resident keeps between commands: whether this process serves as one (its own
``measure`` then never forwards) and the models it keeps loaded (:class:`KeptModels`), loaded
again when a file of the checkpoint changed."""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, Protocol, TypeVar

__all__ = ["KeptModels", "KeptVolumes", "keeping_models", "serving", "serving_here"]

logger = logging.getLogger(__name__)

_KEPT_MODELS = 2  # models a resident keeps loaded at most (the least recently used goes)
_KEPT_VOLUMES = 4  # studies a resident keeps loaded at most ...
_KEPT_VOLUME_BYTES = 1 << 30  # ... and at most this many bytes of voxels

T = TypeVar("T")
_Signature = tuple[tuple[str, int, int, int], ...]

_serving = False  # True in a resident: its own measure never forwards
_keeping = False


class _Clearable(Protocol):
    def clear(self) -> None: ...


_caches: list[_Clearable] = []


def serving_here() -> bool:
    """Whether this process is a resident serving clients (its ``measure`` measures here)."""
    return _serving


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """This process serves as a resident inside."""
    global _serving
    _serving = True
    try:
        yield
    finally:
        _serving = False


@contextlib.contextmanager
def keeping_models() -> Iterator[None]:
    """:meth:`KeptModels.get` keeps what it loads inside (a resident; elsewhere each command
    loads its model once anyway); forgotten after."""
    global _keeping
    _keeping = True
    try:
        yield
    finally:
        _keeping = False
        for cache in _caches:
            cache.clear()


def _files_signature(directory: Path) -> _Signature:
    entries = []
    for path in sorted(directory.iterdir()):
        with contextlib.suppress(OSError):
            info = path.stat()
            entries.append((path.name, info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(entries)


class KeptModels(Generic[T]):
    """Models of one kind that a resident keeps loaded, by checkpoint directory and variant
    (the :data:`_KEPT_MODELS` most recently used)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[Path, bool], tuple[_Signature, T]] = OrderedDict()
        _caches.append(self)  # cleared by keeping_models()

    def clear(self) -> None:
        self._kept.clear()

    def get(self, directory: Path, variant: bool, load: Callable[[], T]) -> T:
        """``load()``'s model of ``directory`` (one of its two ``variant``\\ s), loaded again
        only when a file of the directory changed (name, size, time, inode), in a process that
        :func:`keeping_models`; elsewhere just ``load()``."""
        if not _keeping:
            return load()
        try:
            key, signature = (directory.resolve(), variant), _files_signature(directory)
        except OSError:  # not a folder: the loader says why, as it does outside a resident
            return load()
        kept = self._kept.get(key)
        if kept is not None and kept[0] == signature:
            self._kept.move_to_end(key)
            return kept[1]
        if kept is not None:
            logger.info("the model's files changed: loading it again")
        model = load()
        self._kept[key] = (signature, model)
        self._kept.move_to_end(key)
        while len(self._kept) > _KEPT_MODELS:
            self._kept.popitem(last=False)
        return model


def _tree_signature(path: Path) -> _Signature:
    """Every file under ``path`` (or ``path`` itself): name, size, time, inode."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    entries = []
    for file in files:
        with contextlib.suppress(OSError):
            info = file.stat()
            entries.append((str(file), info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(entries)


class KeptVolumes(Generic[T]):
    """Studies a resident keeps loaded between commands (a reader clicking on one study asks
    ``measure --at`` again and again), by path and how its images are read: loaded again when
    a file under the path changed (name, size, time, inode); the :data:`_KEPT_VOLUMES` most
    recently used, within :data:`_KEPT_VOLUME_BYTES` of voxels."""

    def __init__(self, size_of: Callable[[T], int]) -> None:
        self._size_of = size_of
        self._kept: OrderedDict[tuple[Path, str], tuple[_Signature, T]] = OrderedDict()
        _caches.append(self)  # cleared by keeping_models()

    def clear(self) -> None:
        self._kept.clear()

    def get(self, path: Path, variant: str, load: Callable[[], T]) -> T:
        """``load()``'s result for ``path``, loaded again only when a file under it changed, in
        a process that :func:`keeping_models`; elsewhere just ``load()``."""
        if not _keeping:
            return load()
        try:
            key, signature = (path.resolve(), variant), _tree_signature(path)
        except OSError:  # the loader says why, as it does outside a resident
            return load()
        kept = self._kept.get(key)
        if kept is not None and kept[0] == signature and signature:
            self._kept.move_to_end(key)
            return kept[1]
        loaded = load()
        self._kept[key] = (signature, loaded)
        self._kept.move_to_end(key)
        while len(self._kept) > _KEPT_VOLUMES or (
            len(self._kept) > 1
            and sum(self._size_of(v) for _, v in self._kept.values()) > _KEPT_VOLUME_BYTES
        ):
            self._kept.popitem(last=False)
        return loaded
