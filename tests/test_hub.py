"""Hub dataset loaders (`hub:<name>`) on fabricated `datasets.Dataset`s with each repo's real
schema (column names, ClassLabel class counts), passed in as `fetch`: no network anywhere."""

from __future__ import annotations

import re
import string
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import datasets as hf  # Hugging Face's package (the repo's own is ovalp_flwr.data.registry)
import numpy as np
import pytest
from PIL import Image

from ovalp_flwr.data import hub as hub_datasets
from ovalp_flwr.features.cache import build_features, cache_path, load_features
from ovalp_flwr.data.registry import (
    AG_NEWS_CLASSES,
    DATASETS,
    LOCAL_MODALITY,
    ImageDataset,
    TextDataset,
    dataset_modality,
    load_dataset,
)
from ovalp_flwr.features.encoders import encoder_identity, load_encoder
from ovalp_flwr.data.hub import (
    HUB_DATASETS,
    HubImages,
    hub_modality,
    load_hub_dataset,
    square_crop,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
# Interleaved classes, so "first N per class" differs from "first rows".
LABELS = {"train": [0, 1, 0, 2, 0, 1, 1], "test": [2, 0, 1]}
SIZE = (8, 8)  # (w, h) of fabricated images unless a test says otherwise


def _class_names(name: str) -> tuple[str, ...]:
    """Real names where the test checks them, generated ones of the real count otherwise."""
    count = HUB_DATASETS[name].num_classes
    if name == "hub:cifar10":
        return CIFAR10_CLASSES
    if name == "hub:ag-news":
        return AG_NEWS_CLASSES
    if name == "hub:emnist-letters":
        return tuple(string.ascii_uppercase)
    if name == "hub:tinyimagenet":
        return tuple(f"n{i:08d}" for i in range(count))
    return tuple(f"class{i:03d}" for i in range(count))


def _grey(name: str, row: int) -> bool:
    """EMNIST is all grey; TinyImageNet has a few grey images among RGB ones (row 1 here)."""
    return name == "hub:emnist-letters" or (name == "hub:tinyimagenet" and row == 1)


def _pixels(name: str, split: str, row: int, size: tuple[int, int] = SIZE) -> np.ndarray:
    """Seeded noise per (dataset, split, row): [H, W] if grey, else [H, W, 3]."""
    rng = np.random.default_rng(zlib.crc32(f"{name}/{split}/{row}".encode()))
    shape = (size[1], size[0]) if _grey(name, row) else (size[1], size[0], 3)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def _expected(name: str, split: str, row: int) -> np.ndarray:
    """What the loader must produce for a fabricated row: RGB, squared where the spec says."""
    image = Image.fromarray(_pixels(name, split, row)).convert("RGB")
    size = HUB_DATASETS[name].square_size
    return np.asarray(square_crop(image, size) if size else image)


def _fabricate(
    name: str,
    split: str,
    *,
    labels: list[int] | None = None,
    images: dict[int, Any] | None = None,
) -> hf.Dataset:
    """A split with the spec's schema (plus the repo's other columns); `images` replaces rows."""
    spec = HUB_DATASETS[name]
    role = "train" if split == spec.splits[0] else "test"  # TinyImageNet's test is `valid`
    labels = LABELS[role] if labels is None else labels
    features: dict[str, Any] = {spec.label_column: hf.ClassLabel(names=list(_class_names(name)))}
    data: dict[str, list[Any]] = {spec.label_column: labels}
    if spec.modality == "text":
        features[spec.input_column] = hf.Value("string")
        data[spec.input_column] = [f"{split} text {i}" for i in range(len(labels))]
    else:
        features[spec.input_column] = hf.Image()
        data[spec.input_column] = [
            (images or {}).get(i) or Image.fromarray(_pixels(name, split, i))
            for i in range(len(labels))
        ]
    if name == "hub:cifar100":
        features["coarse_label"] = hf.ClassLabel(num_classes=20)
        data["coarse_label"] = [0] * len(labels)
    if name == "hub:domainnet":
        features["domain"] = hf.ClassLabel(num_classes=6)
        features["image_path"] = hf.Value("string")
        data["domain"] = [i % 6 for i in range(len(labels))]
        data["image_path"] = [f"{split}/{i}.jpg" for i in range(len(labels))]
    return hf.Dataset.from_dict(data, features=hf.Features(features))


def _fetch(name: str, calls: list[str] | None = None, **kwargs: Any) -> hub_datasets.Fetch:
    def fetch(spec: hub_datasets.HubSpec, split: str) -> hf.Dataset:
        assert spec is HUB_DATASETS[name]
        if calls is not None:
            calls.append(split)
        return _fabricate(name, split, **kwargs)

    return fetch


def _error(name: str, fetch: hub_datasets.Fetch) -> str:
    with pytest.raises(ValueError) as e:
        load_hub_dataset(name, fetch=fetch)
    message = str(e.value)
    assert "\n" not in message
    return message


# --- every spec loads -----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(HUB_DATASETS))
def test_each_spec_loads_with_its_schema(name: str) -> None:
    spec = HUB_DATASETS[name]
    calls: list[str] = []
    ds = load_hub_dataset(name, fetch=_fetch(name, calls))
    assert calls == list(spec.splits)
    assert ds.name == name and ds.modality == spec.modality == hub_modality(name)
    assert ds.num_classes == spec.num_classes and ds.class_names == _class_names(name)
    for split_name, part in zip(spec.splits, (ds.train, ds.test), strict=True):
        role = "train" if split_name == "train" else "test"
        assert part.labels.dtype == np.int64 and part.labels.tolist() == LABELS[role]
    if spec.modality == "text":
        assert isinstance(ds, TextDataset)
        assert ds.train.texts == tuple(f"train text {i}" for i in range(7))
        assert ds.test.texts[0] == f"{spec.splits[1]} text 0"
        return
    assert isinstance(ds, ImageDataset)
    side = spec.square_size
    shape = (side, side) if side else (SIZE[1], SIZE[0])
    for split_name, part in zip(spec.splits, (ds.train, ds.test), strict=True):
        assert isinstance(part.images, HubImages) and len(part.images) == len(part.labels)
        batch = part.images[0 : len(part.labels)]
        assert batch.dtype == np.uint8 and batch.shape == (len(part.labels), *shape, 3)
        for row in range(len(part.labels)):
            assert np.array_equal(batch[row], _expected(name, split_name, row))


def test_class_names_and_grey_images() -> None:
    assert load_hub_dataset("hub:cifar10", fetch=_fetch("hub:cifar10")).class_names == (
        CIFAR10_CLASSES
    )
    assert load_hub_dataset("hub:ag-news", fetch=_fetch("hub:ag-news")).class_names == (
        "World", "Sports", "Business", "Sci/Tech",
    )  # fmt: skip
    tiny = load_hub_dataset("hub:tinyimagenet", fetch=_fetch("hub:tinyimagenet"))
    grey = tiny.train.images[1]  # mode L in the repo
    assert grey.shape == (8, 8, 3)
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    assert np.array_equal(grey[..., 0], _pixels("hub:tinyimagenet", "train", 1))
    letters = load_hub_dataset("hub:emnist-letters", fetch=_fetch("hub:emnist-letters"))
    grey = _pixels("hub:emnist-letters", "test", 2)
    assert np.array_equal(letters.test.images[2], np.repeat(grey[..., None], 3, axis=-1))


def test_limit_per_class_keeps_the_first_rows_of_each_class_in_order() -> None:
    ds = load_hub_dataset("hub:cifar10", limit_per_class=2, fetch=_fetch("hub:cifar10"))
    keep = [0, 1, 2, 3, 5]  # train labels 0 1 0 2 0 1 1: class 0 rows 0, 2; class 1 rows 1, 5
    assert ds.train.labels.tolist() == [LABELS["train"][i] for i in keep]
    expected = np.stack([_expected("hub:cifar10", "train", i) for i in keep])
    assert np.array_equal(ds.train.images[:], expected)
    assert ds.test.labels.tolist() == LABELS["test"]
    texts = load_hub_dataset("hub:ag-news", limit_per_class=1, fetch=_fetch("hub:ag-news"))
    assert texts.train.texts == ("train text 0", "train text 1", "train text 3")


def test_limit_per_class_is_validated() -> None:
    with pytest.raises(ValueError, match=r"limit_per_class=0 is not allowed; use an int >= 1"):
        load_hub_dataset("hub:cifar10", limit_per_class=0, fetch=_fetch("hub:cifar10"))


# --- lazy images ----------------------------------------------------------------------------


def test_images_decode_only_the_rows_asked_for() -> None:
    """Row 5 is not an image: loading and other rows work; asking for it names the repo row."""
    junk = {5: {"bytes": b"not an image", "path": None}}
    ds = load_hub_dataset("hub:cifar10", fetch=_fetch("hub:cifar10", images=junk))
    images = ds.train.images
    first = np.stack([_expected("hub:cifar10", "train", i) for i in range(5)])
    assert np.array_equal(images[0:5], first)
    assert np.array_equal(images[-1], _expected("hub:cifar10", "train", 6))
    with pytest.raises(ValueError, match=r"cannot decode split 'train' rows 4\.\.6 \("):
        images[4:7]
    limited = load_hub_dataset(
        "hub:cifar10", limit_per_class=2, fetch=_fetch("hub:cifar10", images=junk)
    )  # keeps repo rows 0, 1, 2, 3, 5
    assert np.array_equal(limited.train.images[0:4], first[:4])
    with pytest.raises(ValueError, match=r"rows 5\.\.5"):
        limited.train.images[4]


def test_hub_images_indexing() -> None:
    ds = load_hub_dataset("hub:cifar10", fetch=_fetch("hub:cifar10"))
    images = ds.train.images
    rows = [_expected("hub:cifar10", "train", i) for i in range(7)]
    assert len(images) == 7
    assert np.array_equal(images[::3], np.stack(rows[::3]))
    assert np.array_equal(images[5:1:-2], np.stack([rows[5], rows[3]]))
    assert np.array_equal(images[np.int64(2)], rows[2])
    assert images[5:2].shape == (0, 8, 8, 3) and images[5:2].dtype == np.uint8
    assert all(np.array_equal(a, b) for a, b in zip(images, rows, strict=True))
    with pytest.raises(IndexError, match="index 7 is out of range for 7 images"):
        images[7]
    with pytest.raises(TypeError, match="use an int or a slice"):
        images["0"]  # type: ignore[call-overload]


def test_mixed_sizes_on_a_fixed_size_spec_is_an_error() -> None:
    wide = {2: Image.fromarray(np.zeros((8, 9, 3), np.uint8))}
    ds = load_hub_dataset("hub:cifar10", fetch=_fetch("hub:cifar10", images=wide))
    assert ds.train.images[0:2].shape == (2, 8, 8, 3)
    message = "dataset 'hub:cifar10': split 'train' row 2 is 9x8 but row 0 is 8x8; all its images"
    for index in (slice(0, 4), 2):
        with pytest.raises(ValueError, match=f"^{message}"):
            ds.train.images[index]


def test_domainnet_sizes_become_one_center_cropped_square() -> None:
    x = np.arange(300)
    ramp = np.zeros((256, 300, 3), np.uint8)  # 300x256: no resize, columns 22..277 kept
    ramp[..., 0], ramp[..., 1], ramp[..., 2] = x % 256, x // 256, 7
    bands = np.zeros((400, 100, 3), np.uint8)  # 100x400: to 256x1024, rows 384..639 kept
    bands[:100, :, 0], bands[100:300, :, 1], bands[300:, :, 2] = 255, 255, 255
    images = {0: Image.fromarray(ramp), 1: Image.fromarray(bands)}
    fetch = _fetch("hub:domainnet", labels=[0, 1], images=images)
    out = load_hub_dataset("hub:domainnet", fetch=fetch).train.images[:]
    assert out.shape == (2, 256, 256, 3) and out.dtype == np.uint8
    assert np.array_equal(out[0], np.broadcast_to(ramp[:, 22:278], (256, 256, 3)))
    # The crop is original rows 150..250, inside the green band: no red or blue from its ends.
    assert np.abs(out[1].astype(int) - [0, 255, 0]).max() <= 1


def test_square_crop_of_a_portrait_image_keeps_its_middle() -> None:
    tall = np.zeros((40, 10, 3), np.uint8)
    tall[15:25] = 200  # the middle quarter
    out = np.asarray(square_crop(Image.fromarray(tall), 10))
    assert out.shape == (10, 10, 3) and (out == 200).all()


# --- errors ---------------------------------------------------------------------------------


def _fixed(features: dict[str, Any], data: dict[str, list[Any]]) -> hub_datasets.Fetch:
    """Every split is this one table."""
    return lambda spec, split: hf.Dataset.from_dict(data, features=hf.Features(features))


IMAGES = [Image.fromarray(np.zeros((8, 8, 3), np.uint8))] * 2
SCHEMA_ERRORS = {
    "missing column": (
        {"image": hf.Image(), "label": hf.ClassLabel(names=list(CIFAR10_CLASSES))},
        {"image": IMAGES, "label": [0, 1]},
        r"has no column 'img'; columns found: image, label$",
    ),
    "label not a ClassLabel": (
        {"img": hf.Image(), "label": hf.Value("int64")},
        {"img": IMAGES, "label": [0, 1]},
        r"column 'label' is Value\('int64'\), expected a ClassLabel",
    ),
    "class count": (
        {"img": hf.Image(), "label": hf.ClassLabel(num_classes=9)},
        {"img": IMAGES, "label": [0, 1]},
        r"column 'label' has 9 classes, expected 10$",
    ),
    "input not an Image": (
        {"img": hf.Value("string"), "label": hf.ClassLabel(names=list(CIFAR10_CLASSES))},
        {"img": ["a", "b"], "label": [0, 1]},
        r"column 'img' is Value\('string'\), expected an Image$",
    ),
}


@pytest.mark.parametrize("case", list(SCHEMA_ERRORS))
def test_schema_errors_name_the_column(case: str) -> None:
    features, data, expected = SCHEMA_ERRORS[case]
    message = _error("hub:cifar10", _fixed(features, data))
    assert message.startswith("dataset 'hub:cifar10': uoft-cs/cifar10 split 'train' ")
    assert re.search(expected, message)


def test_text_column_must_be_a_string() -> None:
    features = {"text": hf.Value("int64"), "label": hf.ClassLabel(names=list(AG_NEWS_CLASSES))}
    fetch = _fixed(features, {"text": [1, 2], "label": [0, 1]})
    message = _error("hub:ag-news", fetch)
    assert message == (
        "dataset 'hub:ag-news': fancyzhx/ag_news split 'train' column 'text' is "
        "Value('int64'), expected a string Value"
    )


def test_unlabelled_rows_are_an_error() -> None:
    message = _error("hub:ag-news", _fetch("hub:ag-news", labels=[0, -1, 2]))
    assert message.endswith("row 1 has label -1, outside 0..3 (an unlabelled split?)")


def test_train_and_test_class_names_must_agree() -> None:
    def fetch(spec: hub_datasets.HubSpec, split: str) -> hf.Dataset:
        ds = _fabricate("hub:cifar10", split)
        if split == "test":
            renamed = hf.ClassLabel(names=[f"x{i}" for i in range(10)])
            ds = ds.cast_column("label", renamed)
        return ds

    assert "have different ClassLabel names" in _error("hub:cifar10", fetch)


def test_fetch_failure_is_one_line_that_says_what_to_do() -> None:
    def fetch(spec: hub_datasets.HubSpec, split: str) -> hf.Dataset:
        raise ConnectionError(
            "Couldn't reach 'uoft-cs/cifar100' on the Hub (LocalEntryNotFound)\nmore lines"
        )

    with pytest.raises(ValueError) as e:
        load_hub_dataset("hub:cifar100", fetch=fetch)
    assert str(e.value) == (
        "dataset 'hub:cifar100': cannot fetch uoft-cs/cifar100 split 'train' from the Hugging "
        "Face hub (ConnectionError: Couldn't reach 'uoft-cs/cifar100' on the Hub "
        "(LocalEntryNotFound)); on a machine without internet use a local dataset (digits, "
        "cifar10, tinyimagenet-100, mnist, ag-news, usps, mnist-m, syn-digits, digit-domains, "
        "office-caltech10, folder:<name>, csv:<name>)"
    )
    assert isinstance(e.value.__cause__, ConnectionError)


def test_fetch_must_return_a_split_not_a_dict() -> None:
    def fetch(spec: hub_datasets.HubSpec, split: str) -> Any:
        return hf.DatasetDict({split: _fabricate("hub:cifar10", split)})

    assert _error("hub:cifar10", fetch).endswith("came back as DatasetDict, not a datasets.Dataset")


@pytest.mark.parametrize(
    "call",
    [
        lambda: load_dataset("hub:nope"),
        lambda: load_hub_dataset("cifar10"),
        lambda: hub_modality("hub:nope"),
        lambda: dataset_modality("hub:cifar-100"),
    ],
)
def test_unknown_hub_names_list_the_known_ones(call: Any) -> None:
    with pytest.raises(ValueError, match=r"^unknown hub dataset '[^']+'; choose one of ") as e:
        call()
    assert all(name in str(e.value) for name in HUB_DATASETS)


# --- wiring ---------------------------------------------------------------------------------


def test_load_dataset_dispatches_hub_names_to_the_default_fetch(monkeypatch: Any) -> None:
    monkeypatch.setattr(hub_datasets, "_fetch_from_hub", _fetch("hub:cifar10"))
    ds = load_dataset("hub:cifar10", "/no/such/dir", limit_per_class=1)  # data_dir is ignored
    assert ds.name == "hub:cifar10" and ds.train.labels.tolist() == [0, 1, 2]


def test_hub_names_are_listed_with_the_other_prefixes() -> None:
    with pytest.raises(ValueError, match=r"folder:<name>, csv:<name>, hub:<name>, "
                       r"cifar10-c:\[<corruption>:\]<severity>, concept:<dataset>$"):
        load_dataset("nope")


def test_importing_the_loaders_does_not_import_hf_datasets() -> None:
    code = (
        "import sys; import ovalp_flwr.data.hub as h; from ovalp_flwr.data.registry import "
        "dataset_modality as m; assert m('hub:ag-news') == 'text'; print('datasets' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cache_builds_from_a_hub_dataset(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setattr(hub_datasets, "_fetch_from_hub", _fetch("hub:cifar10"))
    built = build_features("hub:cifar10", "pixels", tmp_path, device="cpu", progress=False)
    assert cache_path(tmp_path, "hub:cifar10", "pixels").is_dir()
    cached = load_features("hub:cifar10", "pixels", tmp_path)
    dim = encoder_identity("pixels")["feature_dim"]
    assert cached.train.x.shape == (7, dim) and cached.test.x.shape == (3, dim)
    assert cached.train.y.tolist() == LABELS["train"] and cached.num_classes == 10
    assert cached.manifest["class_names"] == list(CIFAR10_CLASSES)
    rows = np.stack([_expected("hub:cifar10", "test", i) for i in range(3)])
    direct = load_encoder("pixels", device="cpu").encode(rows)
    assert np.array_equal(cached.test.x, direct) and np.array_equal(built.test.x, direct)


# --- dataset_modality -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "modality"),
    [
        ("digits", "image"),
        ("cifar10", "image"),
        ("tinyimagenet-100", "image"),
        ("mnist", "image"),
        ("ag-news", "text"),
        ("folder:pets", "image"),
        ("csv:reviews", "text"),
        *((name, spec.modality) for name, spec in HUB_DATASETS.items()),
    ],
)
def test_dataset_modality_reads_no_data(name: str, modality: str) -> None:
    assert dataset_modality(name) == modality


def test_dataset_modality_rejects_what_load_dataset_rejects() -> None:
    with pytest.raises(ValueError) as loading:
        load_dataset("nope")
    with pytest.raises(ValueError) as asking:
        dataset_modality("nope")
    assert str(asking.value) == str(loading.value)
    with pytest.raises(ValueError, match="is not allowed after the prefix"):
        dataset_modality("folder:a/b")


def test_every_local_dataset_has_a_modality() -> None:
    assert LOCAL_MODALITY.keys() == DATASETS.keys()


@pytest.mark.parametrize("name", list(DATASETS))
def test_dataset_modality_matches_what_loads(name: str) -> None:
    limit = 5 if name == "ag-news" else 2  # a stratified 80/20 split needs >= 4 test texts
    try:
        ds = load_dataset(name, DATA, limit_per_class=limit)
    except FileNotFoundError:
        pytest.skip(f"{name}: data absent from {DATA}")
    assert dataset_modality(name) == ds.modality
