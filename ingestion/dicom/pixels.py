"""Read the pixel data of an ordered stack into one float32 array (HU for CT).

Native little-endian data is read straight from the file offset the header scan recorded (no
second parse, one preallocated output, a one-slice buffer), so peak memory stays close to the
volume itself. Compressed transfer syntaxes go through pydicom's decoders (pylibjpeg, GDCM).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from io import BufferedReader
from pathlib import Path

import numpy as np
import numpy.typing as npt
from pydicom.pixels.utils import pixel_array

from ingestion.dicom._pydicom import quiet_pydicom
from ingestion.dicom.header import PixelLocation, SliceRef
from ingestion.errors import PixelDataError, UnreadableFileError

__all__ = ["read_stack_voxels"]

logger = logging.getLogger(__name__)


def _correct_unused_bits(arr: npt.NDArray[np.integer], bits_stored: int) -> None:
    """Clear (unsigned) or sign-extend (signed) the bits above BitsStored, in place."""
    shift = arr.dtype.itemsize * 8 - bits_stored
    if shift > 0:
        if arr.dtype.kind == "u":  # one pass: clearing the high bits is a mask
            np.bitwise_and(arr, arr.dtype.type((1 << bits_stored) - 1), out=arr)
        else:
            np.left_shift(arr, shift, out=arr)
            np.right_shift(arr, shift, out=arr)


def _read_native(
    handle: BufferedReader, ref: SliceRef, loc: PixelLocation, buf: np.ndarray
) -> None:
    handle.seek(loc.offset)
    got = handle.readinto(buf.data)
    if got != buf.nbytes:
        raise PixelDataError(f"{ref.path}: truncated pixel data: read {got} of {buf.nbytes} bytes")
    _correct_unused_bits(buf, loc.bits_stored)


def _decode(ref: SliceRef) -> npt.NDArray[np.generic]:
    try:
        # a decoder plugin that fails before another succeeds logs its traceback: held back
        with quiet_pydicom(f"decoding {ref.path}"):
            arr = pixel_array(str(ref.path), index=ref.frame, correct_unused_bits=True)
    except OSError:
        raise
    except Exception as exc:  # decoders raise many exception types
        raise PixelDataError(
            f"{ref.path}: cannot decode pixel data ({exc}); check the file or convert it to an "
            "uncompressed transfer syntax"
        ) from exc
    if arr.shape != (ref.rows, ref.columns):
        raise PixelDataError(
            f"{ref.path}: decoded image is {arr.shape}, header says {(ref.rows, ref.columns)}"
        )
    return np.asarray(arr)


def read_stack_voxels(slices: Sequence[SliceRef]) -> npt.NDArray[np.float32]:
    """Return ``(len(slices), rows, columns)`` float32 voxels with Rescale slope/intercept applied.

    Raises:
        PixelDataError: a slice is truncated or cannot be decoded; the message names the file.
        UnreadableFileError: a file cannot be read (permission denied, I/O error).
    """
    rows, cols = slices[0].rows, slices[0].columns
    out = np.empty((len(slices), rows, cols), dtype=np.float32)  # (S, R, C)
    handles: dict[Path, BufferedReader] = {}
    current = slices[0].path  # the file being read
    buffers: dict[str, np.ndarray] = {}
    try:
        for i, ref in enumerate(slices):
            current = ref.path
            loc = ref.native
            if loc is not None:
                buf = buffers.get(loc.dtype)
                if buf is None:
                    buf = buffers[loc.dtype] = np.empty((rows, cols), dtype=loc.dtype)
                handle = handles.get(ref.path)
                if handle is None:
                    if len(handles) > 8:  # single-frame files: do not keep them open
                        for h in handles.values():
                            h.close()
                        handles.clear()
                    handle = handles[ref.path] = ref.path.open("rb")  # BufferedReader
                _read_native(handle, ref, loc, buf)
                pixels: npt.NDArray[np.generic] = buf
            else:
                pixels = _decode(ref)
            target = out[i]
            if ref.slope == 1.0:
                target[...] = pixels
            else:
                np.multiply(pixels, ref.slope, out=target, casting="unsafe")
            if ref.intercept != 0.0:
                target += np.float32(ref.intercept)
    except OSError as exc:
        raise UnreadableFileError.from_os_error(exc.filename or current, exc) from exc
    finally:
        for h in handles.values():
            h.close()
    return out
