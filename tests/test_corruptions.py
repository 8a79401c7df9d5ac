"""CIFAR-10-C-style corruptions: every one changes the image, deterministically per (seed, name,
severity, index), slices corrupt like the whole, severities grow, bad input is refused."""

import numpy as np
import pytest

from ovalp_flwr.data.corruptions import CORRUPTIONS, FAMILIES, SEVERITIES, corrupt

HENDRYCKS = (  # CIFAR-10-C's 15 without frost, which needs his photographs
    "gaussian-noise", "shot-noise", "impulse-noise", "defocus-blur", "glass-blur",
    "motion-blur", "zoom-blur", "snow", "fog", "brightness", "contrast", "elastic-transform",
    "pixelate", "jpeg-compression",
)


def smooth_images(n: int = 8, size: int = 32, seed: int = 0) -> np.ndarray:
    """Seeded random images with some spatial structure (3x3 box-blurred noise): on pure noise
    a blur or a resampling is all change, which hides how strong it is."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 1, (n, size + 2, size + 2, 3))
    blurred = sum(noise[:, i:i + size, j:j + size] for i in range(3) for j in range(3))
    return np.clip(128 + 50 * blurred / blurred.std(), 0, 255).astype(np.uint8)


IMAGES = smooth_images()


def test_the_registry_has_hendrycks_names_and_every_family():
    assert len(CORRUPTIONS) >= 15
    assert set(HENDRYCKS) <= set(CORRUPTIONS)
    assert SEVERITIES == (1, 2, 3, 4, 5)
    for family in FAMILIES:
        assert sum(c.family == family for c in CORRUPTIONS.values()) >= 2, family
    for name, c in CORRUPTIONS.items():
        assert c.name == name and name == name.lower() and " " not in name and "_" not in name
        assert c.family in FAMILIES
        assert all(len(values) == 5 for values in c.levels.values()), name


def test_the_spelt_out_opencv_flags_are_opencvs():
    import cv2

    from ovalp_flwr.data import corruptions

    assert corruptions._INTER_AREA == cv2.INTER_AREA
    assert corruptions._BORDER_REFLECT_101 == cv2.BORDER_REFLECT_101


def test_ranges_are_pinned_so_a_severity_is_a_level():
    noise = CORRUPTIONS["gaussian-noise"].build(5)
    assert type(noise).__name__ == "GaussNoise" and noise.std_range == (0.1, 0.1)
    assert CORRUPTIONS["jpeg-compression"].build(1).quality_range == (80, 80)
    assert CORRUPTIONS["pixelate"].build(5).scale_range == (20 / 32, 20 / 32)


@pytest.mark.parametrize("severity", [1, 5])
@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_every_corruption_changes_images_deterministically(name, severity):
    x = IMAGES[:4]
    before = x.copy()
    out = corrupt(x, name, severity, seed=7)
    assert out.dtype == np.uint8 and out.shape == x.shape
    np.testing.assert_array_equal(x, before)  # input untouched
    assert out is not x
    for image, corrupted in zip(x, out):  # every image changes, not just the batch
        assert not np.array_equal(image, corrupted)
    np.testing.assert_array_equal(corrupt(x, name, severity, seed=7), out)
    other_seed = corrupt(x, name, severity, seed=8)
    if CORRUPTIONS[name].stochastic:
        assert not np.array_equal(other_seed, out)
    else:  # a fixed kernel or colour map: the seed has nothing to change
        np.testing.assert_array_equal(other_seed, out)


@pytest.mark.parametrize("name", sorted(n for n, c in CORRUPTIONS.items() if c.stochastic))
def test_a_slice_corrupts_like_the_whole(name):
    whole = corrupt(IMAGES, name, 3, seed=1)
    np.testing.assert_array_equal(corrupt(IMAGES[3:7], name, 3, seed=1, start=3), whole[3:7])
    # without its offset the slice is seeded as images 0..3: different noise
    assert not np.array_equal(corrupt(IMAGES[3:7], name, 3, seed=1), whole[3:7])


def test_an_image_does_not_depend_on_its_batch():
    alone = corrupt(IMAGES[5:6], "gaussian-noise", 2, seed=4, start=5)
    other_batch = IMAGES.copy()
    other_batch[:5] = 255 - other_batch[:5]
    np.testing.assert_array_equal(corrupt(other_batch, "gaussian-noise", 2, seed=4)[5:6], alone)


def test_the_name_is_part_of_the_seed():
    from ovalp_flwr.data.corruptions import _image_rngs

    a, b = _image_rngs(0, "gaussian-noise", 1, 0), _image_rngs(0, "shot-noise", 1, 0)
    assert a[0].integers(2**62) != b[0].integers(2**62)
    assert a[1].random() != b[1].random()


def _mean_change(name: str, severity: int) -> float:
    return float(np.abs(corrupt(IMAGES, name, severity, seed=0).astype(int) - IMAGES).mean())


@pytest.mark.parametrize("name", [
    "gaussian-noise", "shot-noise", "impulse-noise", "speckle-noise", "gaussian-blur",
    "defocus-blur", "motion-blur", "zoom-blur", "pixelate", "jpeg-compression", "contrast",
    "brightness",
])
def test_severity_grows(name):
    changes = [_mean_change(name, s) for s in SEVERITIES]
    assert all(a < b for a, b in zip(changes, changes[1:])), changes


@pytest.mark.parametrize("shape", [(2, 28, 28, 3), (2, 64, 64, 3), (2, 24, 40, 3), (0, 32, 32, 3)])
def test_other_sizes(shape):
    x = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    for name in CORRUPTIONS:
        out = corrupt(x, name, 5, seed=0)
        assert out.shape == shape and out.dtype == np.uint8, name


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"name": "gausian-noise"}, ["'gausian-noise'", "gaussian-noise", "contrast"]),
    ({"severity": 0}, ["severity 0", "1, 2, 3, 4, 5"]),
    ({"severity": 6}, ["severity 6"]),
    ({"severity": 2.0}, ["severity 2.0"]),
    ({"severity": True}, ["severity True"]),
    ({"images": IMAGES.astype(np.float32)}, ["uint8", "float32"]),
    ({"images": IMAGES[..., 0]}, ["(8, 32, 32)"]),
    ({"images": np.zeros((2, 32, 32, 4), np.uint8)}, ["(2, 32, 32, 4)"]),
    ({"images": IMAGES.tolist()}, ["list"]),
    ({"images": IMAGES[:, :4, :4]}, ["4x4"]),
    ({"seed": -1}, ["seed -1"]),
    ({"start": -3}, ["start -3"]),
])
def test_bad_input_is_one_line_naming_the_value(kwargs, words):
    call = {"images": IMAGES, "name": "gaussian-noise", "severity": 1, "seed": 0} | kwargs
    with pytest.raises(ValueError) as err:
        corrupt(**call)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message
