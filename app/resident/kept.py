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


def _signature(files: list[Path], name: Callable[[Path], str]) -> _Signature:
    """Each file's name, size, time and inode (a file that vanished is left out)."""
    entries = []
    for file in files:
        with contextlib.suppress(OSError):
            info = file.stat()
            entries.append((name(file), info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(entries)


def _files_signature(directory: Path) -> _Signature:
    """The files of a checkpoint directory and of its folders (a click model), its training
    state left out."""
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and "train_state" not in p.relative_to(directory).parts
    )
    return _signature(files, lambda p: str(p.relative_to(directory)))


def _tree_signature(path: Path) -> _Signature:
    """Every file under ``path`` (or ``path`` itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return _signature(files, str)


K = TypeVar("K")


class _Kept(Generic[K, T]):
    """What a resident keeps loaded, by key, until the signature of its files changes; the
    least recently used goes first while ``too_many`` says so. Elsewhere (not
    :func:`keeping_models`) every ``get`` just loads."""

    def __init__(self, too_many: Callable[[list[T]], bool]) -> None:
        self._too_many = too_many
        self._kept: OrderedDict[K, tuple[_Signature, T]] = OrderedDict()
        _caches.append(self)  # cleared by keeping_models()

    def clear(self) -> None:
        self._kept.clear()

    def _get(
        self, key: Callable[[], K], signature: Callable[[], _Signature], load: Callable[[], T]
    ) -> T:
        if not _keeping:
            return load()
        try:
            k, now = key(), signature()
        except OSError:  # the loader says why, as it does outside a resident
            return load()
        kept = self._kept.get(k)
        if kept is not None and kept[0] == now and now:
            self._kept.move_to_end(k)
            return kept[1]
        if kept is not None:
            logger.info("files changed since they were loaded: loading them again")
        loaded = load()
        self._kept[k] = (now, loaded)
        self._kept.move_to_end(k)
        while len(self._kept) > 1 and self._too_many([v for _, v in self._kept.values()]):
            self._kept.popitem(last=False)
        return loaded


class KeptModels(_Kept[tuple[Path, bool], T]):
    """Models of one kind that a resident keeps loaded, by checkpoint directory and variant
    (the :data:`_KEPT_MODELS` most recently used)."""

    def __init__(self) -> None:
        super().__init__(lambda kept: len(kept) > _KEPT_MODELS)

    def get(self, directory: Path, variant: bool, load: Callable[[], T]) -> T:
        """``load()``'s model of ``directory`` (one of its two ``variant``\\ s), loaded again
        only when a file of the directory changed (name, size, time, inode), in a process that
        :func:`keeping_models`; elsewhere just ``load()``."""
        return self._get(
            lambda: (directory.resolve(), variant), lambda: _files_signature(directory), load
        )


class KeptVolumes(_Kept[tuple[Path, str], T]):
    """Studies a resident keeps loaded between commands (a reader clicking on one study asks
    ``measure --at`` again and again), by path and how its images are read: loaded again when
    a file under the path changed (name, size, time, inode); the :data:`_KEPT_VOLUMES` most
    recently used, within :data:`_KEPT_VOLUME_BYTES` of voxels."""

    def __init__(self, size_of: Callable[[T], int]) -> None:
        super().__init__(
            lambda kept: (
                len(kept) > _KEPT_VOLUMES or sum(size_of(v) for v in kept) > _KEPT_VOLUME_BYTES
            )
        )

    def get(self, path: Path, variant: str, load: Callable[[], T]) -> T:
        """``load()``'s result for ``path``, loaded again only when a file under it changed, in
        a process that :func:`keeping_models`; elsewhere just ``load()``."""
        return self._get(lambda: (path.resolve(), variant), lambda: _tree_signature(path), load)
