"""What an inserted lesion copies from its background image (``model.measurer.data._insert``):
the noise of the tissue it goes in (:func:`estimate_noise`) and the image's blur
(:func:`estimate_blur`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry

__all__ = ["BLUR_RANGE_PX", "Noise", "estimate_blur", "estimate_noise"]

logger = logging.getLogger(__name__)

_DEFAULT_BLUR_PX = 0.6
BLUR_RANGE_PX = (0.3, 2.0)
"""What a measured blur is kept within (a CT's point spread is about 0.5-1.5 pixels)."""

Image = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Noise:
    """Gaussian noise of standard deviation ``sigma_hu`` whose neighbouring pixels (in plane)
    correlate by ``correlation``: white noise blurred by a Gaussian of ``kernel_px`` pixels with
    ``exp(-1 / (4 kernel_px^2)) = correlation``."""

    sigma_hu: float
    correlation: float

    @property
    def kernel_px(self) -> float:
        if self.correlation <= 0.05:
            return 0.0
        return math.sqrt(-1.0 / (4.0 * math.log(self.correlation)))

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> Image:
        from scipy import ndimage

        white = rng.normal(size=shape)
        s = self.kernel_px
        if s == 0.0:
            return (white * self.sigma_hu).astype(np.float32)
        blurred = ndimage.gaussian_filter(white, (0.0, s, s), mode="wrap")
        delta = np.zeros((1, 2 * int(4 * s) + 3, 2 * int(4 * s) + 3))
        delta[0, delta.shape[1] // 2, delta.shape[2] // 2] = 1.0
        gain = math.sqrt(float((ndimage.gaussian_filter(delta, (0.0, s, s)) ** 2).sum()))
        result: Image = np.asarray(blurred / gain * self.sigma_hu, dtype=np.float32)
        return result


def _robust_std(values: npt.NDArray[np.float64]) -> float:
    if values.size < 20:
        return float("nan")
    return 1.4826 * float(np.median(np.abs(values - np.median(values))))


def estimate_noise(image: Image, region: Mask) -> Noise | None:
    """The noise of ``image`` over ``region`` (a homogeneous tissue): its standard deviation
    (a robust one, of the image minus its 3-pixel in-plane Gaussian mean) and the correlation
    of neighbouring pixels from the spread of their differences,
    ``var(x_i - x_(i+1)) = 2 sigma^2 (1 - rho)``. None where the region has too few pixels."""
    from scipy import ndimage

    if region.sum() < 50:
        return None
    residual = image - ndimage.gaussian_filter(image, (0.0, 3.0, 3.0))
    sigma = _robust_std(residual[region].astype(np.float64))
    pairs = []
    for axis in (1, 2):
        a = [slice(None)] * 3
        b = [slice(None)] * 3
        a[axis], b[axis] = slice(1, None), slice(None, -1)
        both = region[tuple(a)] & region[tuple(b)]
        pairs.append((image[tuple(a)] - image[tuple(b)])[both].astype(np.float64))
    diff = _robust_std(np.concatenate(pairs))
    if not (math.isfinite(sigma) and math.isfinite(diff)) or sigma <= 0:
        return None
    correlation = float(np.clip(1.0 - diff * diff / (2.0 * sigma * sigma), 0.0, 0.9))
    return Noise(sigma, correlation)


def estimate_blur(image: Image, body: Mask, geometry: Geometry) -> float:
    """The image's own blur, as the standard deviation (pixels) of a Gaussian point spread:
    at the body's outline against outside air, a step of height H blurred by a Gaussian of
    sigma has a steepest gradient of ``H / (sqrt(2 pi) sigma)``. H per slice: the median HU 3-5
    pixels inside minus 3-5 pixels outside (air, -1100..-800 HU: not the padding outside the
    scanner's field); the gradient: a Gaussian derivative of 1 pixel (its own spread subtracted
    in quadrature), its largest value within 2 pixels of each outline pixel next to air; the
    median over up to 9 slices, kept within ``BLUR_RANGE_PX``. ``_DEFAULT_BLUR_PX`` where the
    image shows no such edge (logged)."""
    from scipy import ndimage

    estimates: list[float] = []
    slices = np.unique(np.linspace(0, image.shape[0] - 1, min(9, image.shape[0])).astype(int))
    derivative = 1.0
    for k in slices:
        mask = body[k]
        air = ~mask & (image[k] > -1100.0) & (image[k] < -800.0)
        if mask.sum() < 100 or air.sum() < 100:
            continue
        outline = (
            mask
            & ~ndimage.binary_erosion(mask, border_value=1)
            & ndimage.binary_dilation(air, iterations=2)
        )
        inner = ndimage.binary_erosion(
            mask, iterations=3, border_value=1
        ) & ~ndimage.binary_erosion(mask, iterations=5, border_value=1)
        outer = (
            ndimage.binary_dilation(mask, iterations=5)
            & ~ndimage.binary_dilation(mask, iterations=3)
            & air
        )
        if outline.sum() < 50 or inner.sum() < 50 or outer.sum() < 50:
            continue
        height = float(np.median(image[k][inner]) - np.median(image[k][outer]))
        if height < 300.0:
            continue
        gradient = ndimage.gaussian_gradient_magnitude(image[k].astype(np.float64), derivative)
        peak = ndimage.maximum_filter(gradient, size=5)[outline]
        total = height / (math.sqrt(2.0 * math.pi) * float(np.median(peak)))
        estimates.append(math.sqrt(max(total * total - derivative * derivative, 0.0)))
    if not estimates:
        logger.info("no air edge to measure the blur on; %.1f pixel assumed", _DEFAULT_BLUR_PX)
        return _DEFAULT_BLUR_PX
    blur = float(np.median(estimates))
    low, high = BLUR_RANGE_PX
    if not low <= blur <= high:
        logger.info("blur of %.2f pixel measured; kept within %g-%g", blur, low, high)
    return float(np.clip(blur, low, high))
