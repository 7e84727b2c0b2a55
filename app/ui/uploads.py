"""Uploads: a zipped DICOM folder or a NIfTI file, checked, unpacked safely, kept under the data
dir, ingested, measured and stored.

A zip is refused whole, with the reason, when any member would land outside its folder (an
absolute path, ``..``, a link), when it holds more than :data:`MAX_MEMBERS` files, or when its
unpacked size exceeds the limit (a zip bomb); a NIfTI larger than the limit is refused too.
What is kept is readable by the server's user only (0700 folders, 0600 files, whatever the
umask).
"""

from __future__ import annotations

import shutil
import stat
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from app.files import private_file
from db.private_paths import make_private_dirs
from ingestion.errors import ConfigurationError

__all__ = ["MAX_MEMBERS", "StoredUpload", "UploadError", "receive_upload"]

MAX_MEMBERS = 5000


class UploadError(ConfigurationError):
    """An upload that cannot be used; the message says why and what to send instead."""


@dataclass(frozen=True)
class StoredUpload:
    """Where an accepted upload was kept."""

    path: Path  # the folder of a zip's files, or the NIfTI file
    kind: str  # "dicom" or "nifti"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _safe_member(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise UploadError(
            f"the zip holds {name!r}, which would be written outside its folder; it was refused "
            "whole"
        )
    return path


def _unzip(source: Path, target: Path, max_bytes: int) -> None:
    try:
        archive = zipfile.ZipFile(source)
    except zipfile.BadZipFile as error:
        raise UploadError(f"{source.name} is not a readable zip file: {error}") from error
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UploadError(
                f"the zip holds {len(members)} files; at most {MAX_MEMBERS} are accepted"
            )
        total = sum(m.file_size for m in members)
        if total > max_bytes:
            raise UploadError(
                f"the zip unpacks to {_size(total)}; at most {_size(max_bytes)} are accepted"
            )
        for member in members:
            _safe_member(member.filename)
            if stat.S_ISLNK(member.external_attr >> 16):
                raise UploadError(
                    f"the zip holds a link, {member.filename!r}; it was refused whole"
                )
        make_private_dirs(target)
        for member in members:
            if member.is_dir():
                continue
            destination = target.joinpath(*_safe_member(member.filename).parts)
            make_private_dirs(destination.parent)
            with archive.open(member) as source_file, private_file(destination) as out:
                shutil.copyfileobj(source_file, out)


def receive_upload(
    file: Path,
    upload_dir: Path,
    *,
    max_bytes: int,
    on_step: Callable[[str], None] | None = None,
) -> StoredUpload:
    """Check and keep an uploaded file (module doc); raises ``UploadError`` with the reason."""
    name = file.name.lower()
    if not file.is_file():
        raise UploadError("nothing was uploaded")
    if file.stat().st_size > max_bytes:
        raise UploadError(
            f"{file.name} is {_size(file.stat().st_size)}; at most {_size(max_bytes)} are accepted"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    folder = upload_dir / f"{stamp}-{uuid.uuid4().hex[:8]}"
    if name.endswith(".zip"):
        if on_step is not None:
            on_step("unpacking")
        try:
            _unzip(file, folder / "dicom", max_bytes)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return StoredUpload(folder / "dicom", "dicom")
    if name.endswith(".nii") or name.endswith(".nii.gz"):
        make_private_dirs(folder)
        target = folder / ("image.nii.gz" if name.endswith(".gz") else "image.nii")
        with file.open("rb") as source_file, private_file(target) as out:
            shutil.copyfileobj(source_file, out)
        return StoredUpload(target, "nifti")
    raise UploadError(
        f"{file.name} is neither a zip of a DICOM folder nor a NIfTI file (.nii, .nii.gz)"
    )
