"""CIFAR-10-C-style image corruptions (Hendrycks & Dietterich, ICLR 2019) at five severities.

Why albumentations: a maintained (MIT) library whose transforms already include ports of most
of Hendrycks's corruptions (GlassBlur, Defocus, ZoomBlur and Spatter cite the paper), fast
(OpenCV underneath), and drawing its randomness from generators we can seed per image. The
original `make_cifar_c.py` needs ImageMagick (Wand), scikit-image and frost photographs; we
need none of them. Each corruption is one albumentations transform at `p=1.0`. Our own code is
two adapters: defocus at fractional radii (A.Defocus only takes integers >= 1) and snow
(below), both built on albumentations' kernels. albumentations (and torch, which it imports)
is loaded on the first `corrupt` call, not when this module is imported.

The table `CORRUPTIONS` gives, per corruption, the transform's parameters at severities 1..5.
Where an albumentations parameter means what Hendrycks's does, the values are his CIFAR-10
ones (`make_cifar_c.py`); otherwise they are our monotone choice, marked "ours" in the table.
Parameters that albumentations samples from a range are pinned, (v, v), so a severity is a
level, not a random draw up to it; what stays random is the noise itself (which pixels, where
the drops fall, the motion direction). Pixel-sized parameters (blur sigmas, kernel sizes,
elastic sigma) are CIFAR's, for 32x32: the corruptions run at any size (at least 8x8), but
on larger images those are milder.

What differs from CIFAR-10-C:
- frost is left out: it blends in Hendrycks's frost photographs, which we do not have.
- fog is albumentations' plasma fractal (PlasmaBrightnessContrast: brighter and flatter where
  the plasma is dense); Hendrycks's fog is a plasma fractal too, blended differently; the
  levels are ours. rain (RandomRain) is not in CIFAR-10-C; its levels are ours.
- snow is Hendrycks's algorithm and table, on albumentations' zoom and convolution:
  A.RandomSnow's "texture" method adds the snow layer to all three HSV channels (a hue shift
  of up to ~50 degrees) and wraps bright pixels past 255 to black, and its "bleach" method is
  a fixed, non-random brightening, neither of them snow on a 32x32 image.
- shot-noise draws the Poisson counts in linear light (gamma 2.2), at Hendrycks's photon
  counts; impulse-noise replaces whole pixels (all channels), skimage replaced single values;
  speckle-noise multiplies by uniform noise of Hendrycks's standard deviation, not Gaussian.
- motion-blur is a one-sided line kernel of 3..11 px within 45 degrees of horizontal (ours;
  ImageMagick's Gaussian-weighted one, sigma 1..2.5, there); glass-blur uses GlassBlur's
  vectorised ("fast") pixel swap rather than Hendrycks's sequential one.
- elastic-transform is albumentations' displacement field only (uniform noise smoothed by a
  Gaussian, as Hendrycks's), alpha/sigma ours. Hendrycks's CIFAR version is mostly a random
  affine warp (his elastic part moves pixels by < 0.6 px; severity 1 is the affine alone),
  which we do not reproduce.
- contrast and saturate are torchvision-style (blend with the grey image's mean / with the
  grey image) at Hendrycks's factors, rather than per-channel means / HSV saturation; saturate
  drops his small additive terms. As in CIFAR-10-C, saturate desaturates at severities 1-2 and
  oversaturates at 3-5: it is not monotone in strength.
- pixelate goes to Hendrycks's sizes (32 px to 30, 28, 27, 24, 20 px) and back with OpenCV's
  area interpolation, not PIL's BOX filter; on 32x32 it changes an image more (mean absolute
  difference ~3/255 already at severity 1, where PIL's is ~1/255).

Determinism: image i of a call is corrupted with generators seeded from
`np.random.SeedSequence([seed, crc32(name), severity, start + i])`, so its result depends on
(seed, name, severity, start + i, image i) only: not on the batch size or the other images,
and corrupting a slice with `start` = its offset gives those rows of corrupting the whole.
Reseeding costs ~25-50 us per image, against 0.1-1 ms for the transforms.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from albumentations.core.transforms_interface import BasicTransform

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
FAMILIES: tuple[str, ...] = ("noise", "blur", "weather", "digital")

# OpenCV's flag values, spelt out so the table does not import cv2 (tests check them)
_INTER_AREA, _BORDER_REFLECT_101 = 3, 4
_MIN_SIDE = 8  # rain, glass-blur and fog fail on 1-pixel sides; 8 leaves a margin


@dataclass(frozen=True)
class Corruption:
    """One corruption: an albumentations transform and its parameters at each severity.

    `transform` names an attribute of the albumentations package (or, for what it lacks, a
    builder in `_LOCAL_TRANSFORMS`); `levels` maps a parameter to its 5 values, severities
    1..5; `fixed` holds the parameters that are the same at every severity. `stochastic` is
    False where the output does not depend on the seed (blurs by a fixed kernel, colour
    changes, JPEG, pixelate).
    """

    name: str
    family: str
    transform: str
    levels: Mapping[str, tuple[Any, ...]]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    stochastic: bool = True

    def kwargs(self, severity: int) -> dict[str, Any]:
        """The transform's keyword arguments at `severity` (p=1.0: it always applies)."""
        _check_severity(severity)
        return {**self.fixed, **{k: v[severity - 1] for k, v in self.levels.items()}, "p": 1.0}

    def build(self, severity: int) -> BasicTransform:
        """The albumentations transform at `severity`, unseeded."""
        kwargs = self.kwargs(severity)
        local = _LOCAL_TRANSFORMS.get(self.transform)
        if local is not None:
            return local(**kwargs)
        return getattr(_albumentations(), self.transform)(**kwargs)


def _pinned(*values: Any) -> tuple[tuple[Any, Any], ...]:
    """Each value as a (v, v) range: albumentations then draws exactly v."""
    return tuple((v, v) for v in values)


def _defocus_image(img: np.ndarray, *, radius: float, alias_blur: float, **_: Any) -> np.ndarray:
    """albumentations' own defocus kernel, which takes a fractional radius."""
    from albumentations.augmentations.blur.functional import defocus  # late: albumentations, ~2 s

    return defocus(img, radius, alias_blur)


def _fractional_defocus(radius: float, alias_blur: float, p: float) -> BasicTransform:
    """Defocus at Hendrycks's CIFAR radii (0.3-1.5 px). A.Defocus only draws integer radii
    >= 1, and radius 1 is already his severity 4; its kernel function takes any radius."""
    blur = partial(_defocus_image, radius=radius, alias_blur=alias_blur)
    return _albumentations().Lambda(image=blur, name="FractionalDefocus", p=p)


def _streak_kernel(radius: float, sigma: float, angle: float) -> np.ndarray:
    """ImageMagick's motion-blur kernel, which Hendrycks's snow uses: Gaussian weights
    (sigma) along a one-sided ray of 2 * ceil(radius) + 1 pixels at `angle` degrees."""
    width = 2 * int(np.ceil(radius)) + 1
    steps = np.arange(width)
    weights = np.exp(-(steps**2) / (2 * sigma**2))
    dx = np.ceil(steps * np.cos(np.deg2rad(angle)) - 0.5).astype(int)
    dy = np.ceil(steps * np.sin(np.deg2rad(angle)) - 0.5).astype(int)
    kernel = np.zeros((2 * width - 1, 2 * width - 1), dtype=np.float32)
    np.add.at(kernel, (dy + width - 1, dx + width - 1), weights / weights.sum())
    return kernel


def _snow_image(img: np.ndarray, layer: np.ndarray, blend: float) -> np.ndarray:
    """Hendrycks's snow on one image: whiten it a little (towards 1.5 * grey + 0.5), then
    add the flake layer twice, once turned 180 degrees."""
    x = img.astype(np.float32) / 255
    grey = (x @ np.float32([0.299, 0.587, 0.114]))[..., None]
    x = blend * x + (1 - blend) * np.maximum(x, 1.5 * grey + 0.5)
    x += layer[..., None] + layer[::-1, ::-1, None]
    return np.rint(np.clip(x, 0, 1) * 255).astype(np.uint8)


@cache
def _hendrycks_snow_class() -> type[BasicTransform]:
    """Hendrycks's snow as an albumentations transform, drawing from the transform's own
    generators. albumentations' RandomSnow does not fit: its "texture" method adds the snow
    layer to all three HSV channels (a hue shift of up to ~50 degrees) and wraps bright
    pixels past 255 to black; its "bleach" method is a fixed, non-random brightening."""
    A = _albumentations()
    # late: albumentations takes ~2 s; only corrupting images needs it
    from albumentations.augmentations.blur.functional import central_zoom
    from albumentations.augmentations.pixel.functional import convolve  # late: likewise

    class HendrycksSnow(A.ImageOnlyTransform):  # type: ignore[misc,valid-type]
        def __init__(self, loc: float, scale: float, zoom: float, threshold: float,
                     radius: float, sigma: float, blend: float, p: float = 1.0) -> None:
            super().__init__(p=p)
            self.loc, self.scale, self.zoom, self.threshold = loc, scale, zoom, threshold
            self.radius, self.sigma, self.blend = radius, sigma, blend

        def get_params_dependent_on_data(self, params: dict[str, Any],
                                         data: dict[str, Any]) -> dict[str, Any]:
            height, width = params["shape"][:2]
            layer = self.random_generator.normal(self.loc, self.scale, (height, width))
            layer = central_zoom(layer.astype(np.float32), self.zoom)
            layer = np.clip(np.where(layer < self.threshold, 0, layer), 0, 1)
            # falling: within 45 degrees of vertical
            kernel = _streak_kernel(self.radius, self.sigma, self.py_random.uniform(-135, -45))
            return {"layer": convolve(layer.astype(np.float32), kernel)}

        def apply(self, img: np.ndarray, layer: np.ndarray, **params: Any) -> np.ndarray:
            return _snow_image(img, layer, self.blend)

    return HendrycksSnow


def _hendrycks_snow(**kwargs: Any) -> BasicTransform:
    return _hendrycks_snow_class()(**kwargs)


_LOCAL_TRANSFORMS: dict[str, Callable[..., BasicTransform]] = {
    "FractionalDefocus": _fractional_defocus,
    "HendrycksSnow": _hendrycks_snow,
}

_SPATTER_WATER, _SPATTER_MUD = (175, 238, 238), (63, 42, 20)  # Hendrycks's colours, RGB
_SPEC = 3**0.5  # a uniform draw on (1 - a, 1 + a) has standard deviation a / sqrt(3)

_TABLE: tuple[Corruption, ...] = (
    # ---- noise (fractions of the [0, 1] range unless said)
    Corruption("gaussian-noise", "noise", "GaussNoise",
               {"std_range": _pinned(0.04, 0.06, 0.08, 0.09, 0.10)}),
    Corruption("shot-noise", "noise", "ShotNoise",  # 1 / photons per unit intensity
               {"scale_range": _pinned(1 / 500, 1 / 250, 1 / 100, 1 / 75, 1 / 50)}),
    Corruption("impulse-noise", "noise", "SaltAndPepper",  # fraction of pixels
               {"amount": _pinned(0.01, 0.02, 0.03, 0.05, 0.07)},
               {"salt_vs_pepper": (0.5, 0.5)}),
    Corruption("speckle-noise", "noise", "MultiplicativeNoise",  # std 0.06 .. 0.20
               {"multiplier": tuple((1 - _SPEC * c, 1 + _SPEC * c)
                                    for c in (0.06, 0.10, 0.12, 0.16, 0.20))},
               {"per_channel": True, "elementwise": True}),
    # ---- blur (pixels)
    Corruption("defocus-blur", "blur", "FractionalDefocus",
               {"radius": (0.3, 0.4, 0.5, 1.0, 1.5),
                "alias_blur": (0.4, 0.5, 0.6, 0.2, 0.1)}, stochastic=False),
    Corruption("glass-blur", "blur", "GlassBlur",
               {"sigma": (0.05, 0.25, 0.4, 0.25, 0.4),
                "iterations": (1, 1, 1, 2, 2)},
               {"max_delta": 1, "mode": "fast"}),
    Corruption("motion-blur", "blur", "MotionBlur",  # ours: kernel length
               {"blur_limit": _pinned(3, 5, 7, 9, 11)},
               # a ray from the centre within 45 degrees of horizontal, as Hendrycks's angles
               {"angle_range": (135, 225), "direction_range": (-1.0, -1.0),
                "allow_shifted": False}),
    Corruption("zoom-blur", "blur", "ZoomBlur",  # zooms 1, 1.01, ... up to the max
               {"max_factor": _pinned(1.06, 1.11, 1.16, 1.21, 1.26)},
               {"step_factor": (0.01, 0.01)}, stochastic=False),
    Corruption("gaussian-blur", "blur", "GaussianBlur",
               {"sigma_limit": _pinned(0.4, 0.6, 0.7, 0.8, 1.0)},
               {"blur_limit": 0}, stochastic=False),  # kernel size from sigma
    # ---- weather
    Corruption("snow", "weather", "HendrycksSnow",  # see _hendrycks_snow_class
               {"loc": (0.1, 0.1, 0.15, 0.25, 0.3),  # the flake layer's normal draw
                "scale": (0.2, 0.2, 0.3, 0.3, 0.3),
                "zoom": (1.0, 1.0, 1.75, 2.25, 1.25),  # flake size
                "threshold": (0.6, 0.5, 0.55, 0.6, 0.65),  # below it: no flake
                "radius": (8, 10, 10, 12, 14),  # streak: ImageMagick's motion blur
                "sigma": (3, 4, 4, 6, 12),
                "blend": (0.95, 0.9, 0.9, 0.85, 0.8)}),  # weight of the unwhitened image
    Corruption("fog", "weather", "PlasmaBrightnessContrast",  # ours, but a plasma fractal too
               {"brightness_range": _pinned(0.1, 0.2, 0.25, 0.3, 0.35),
                "contrast_range": _pinned(-0.1, -0.2, -0.25, -0.3, -0.35),
                "roughness": (1 / 3, 1 / 3, 1 / 2.5, 1 / 2, 1 / 1.75)}),  # Hendrycks's decay
    Corruption("brightness", "weather", "HueSaturationValue",  # HSV value + c, 0..255 units
               {"val_shift_limit": _pinned(*(255 * c for c in (0.05, 0.1, 0.15, 0.2, 0.3)))},
               {"hue_shift_limit": (0, 0), "sat_shift_limit": (0, 0)}, stochastic=False),
    Corruption("spatter", "weather", "Spatter",  # water drops at 1-3, mud at 4-5
               {"mean": _pinned(0.62, 0.65, 0.65, 0.65, 0.65),
                "std": _pinned(0.1, 0.1, 0.3, 0.1, 0.1),
                "gauss_sigma": _pinned(0.7, 0.8, 1.0, 0.7, 0.5),
                "cutout_threshold": _pinned(0.7, 0.7, 0.69, 0.69, 0.68),
                "intensity": _pinned(0.5, 0.5, 0.5, 0.6, 0.6),
                "mode": ("rain", "rain", "rain", "mud", "mud"),
                "color": (_SPATTER_WATER,) * 3 + (_SPATTER_MUD,) * 2}),
    Corruption("rain", "weather", "RandomRain",  # ours; drops: H/4, H/3, H, H, 2H
               {"rain_type": ("drizzle", "default", "heavy", "heavy", "torrential"),
                "brightness_coefficient": (0.95, 0.9, 0.85, 0.8, 0.75)},
               # slant: pixels of sideways drift per drop (not degrees); no blur of the streaks
               {"slant_range": (-2, 2), "blur_value": 1}),
    # ---- digital
    Corruption("contrast", "digital", "ColorJitter",  # factor around the mean
               {"contrast": _pinned(0.75, 0.5, 0.4, 0.3, 0.15)},
               {"brightness": (1, 1), "saturation": (1, 1), "hue": (0, 0)}, stochastic=False),
    Corruption("elastic-transform", "digital", "ElasticTransform",  # ours (pixels)
               {"alpha": (8.0, 12.0, 16.0, 20.0, 24.0)},
               {"sigma": 3.0, "noise_distribution": "uniform",
                "border_mode": _BORDER_REFLECT_101}),
    Corruption("pixelate", "digital", "Downscale",  # 32 px to 30, 28, 27, 24, 20 px and back
               {"scale_range": _pinned(*(side / 32 for side in (30, 28, 27, 24, 20)))},
               {"interpolation_pair": {"downscale": _INTER_AREA, "upscale": _INTER_AREA}},
               stochastic=False),
    Corruption("jpeg-compression", "digital", "ImageCompression",  # JPEG quality
               {"quality_range": _pinned(80, 65, 58, 50, 40)},
               {"compression_type": "jpeg"}, stochastic=False),
    Corruption("saturate", "digital", "ColorJitter",  # saturation factor
               {"saturation": _pinned(0.3, 0.1, 1.5, 2.0, 2.5)},
               {"brightness": (1, 1), "contrast": (1, 1), "hue": (0, 0)}, stochastic=False),
)

CORRUPTIONS: dict[str, Corruption] = {c.name: c for c in _TABLE}


def corrupt(
    images: np.ndarray, name: str, severity: int, seed: int, *, start: int = 0
) -> np.ndarray:
    """A corrupted copy of `images` (uint8 [N, H, W, 3] RGB); the input is never modified.

    `start` is the index of images[0] in the whole dataset: image i is seeded by
    (seed, name, severity, start + i), so corrupt(x[a:b], ..., start=a) equals
    corrupt(x, ...)[a:b].
    """
    corruption = _lookup(name)
    _check_severity(severity)
    _check_images(images)
    _check_index("seed", seed)
    _check_index("start", start)
    transform = corruption.build(severity)
    out = np.array(images, dtype=np.uint8, copy=True, order="C")
    for i in range(len(out)):
        transform.set_random_state(*_image_rngs(seed, name, severity, start + i))
        out[i] = transform(image=out[i])["image"]
    return out


def _image_rngs(
    seed: int, name: str, severity: int, index: int
) -> tuple[np.random.Generator, random.Random]:
    """The numpy and Python generators albumentations draws from, for one image."""
    key = np.random.SeedSequence([seed, zlib.crc32(name.encode()), severity, index])
    rng = np.random.default_rng(key)
    return rng, random.Random(int(rng.integers(2**63)))


def _albumentations() -> Any:
    """albumentations, imported on first use; its PyPI update check is switched off (a
    network call at import)."""
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    import albumentations  # late: ~2 s to import; only corrupting images needs it

    return albumentations


def _lookup(name: str) -> Corruption:
    if name not in CORRUPTIONS:
        raise ValueError(f"corruption {name!r} is not allowed; choose one of: "
                         f"{', '.join(sorted(CORRUPTIONS))}")
    return CORRUPTIONS[name]


def _check_severity(severity: int) -> None:
    if not _is_int(severity) or severity not in SEVERITIES:
        raise ValueError(f"severity {severity!r} is not allowed; choose one of: "
                         f"{', '.join(map(str, SEVERITIES))}")


def _check_images(images: np.ndarray) -> None:
    if not isinstance(images, np.ndarray):
        raise ValueError(f"images must be a uint8 numpy array [N, H, W, 3]; got "
                         f"{type(images).__name__}")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise ValueError(f"images must be uint8 [N, H, W, 3] RGB; got {images.dtype} "
                         f"with shape {images.shape}")
    if min(images.shape[1:3]) < _MIN_SIDE:
        raise ValueError(f"images must be at least {_MIN_SIDE}x{_MIN_SIDE} pixels; got "
                         f"{images.shape[1]}x{images.shape[2]}")


def _check_index(what: str, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{what} {value!r} is not allowed; use an integer >= 0")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)
