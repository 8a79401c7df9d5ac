"""Dataset loaders: small slices of the real files in ../shared/data, tiny generated folders,
zips and CSVs for the generic `folder:` / `csv:` loaders, and the errors users will see."""

from __future__ import annotations

import csv
import io
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ovalp_flwr.data import registry as datasets
from ovalp_flwr.data.registry import (
    DATA_DIR_ENV,
    ImageDataset,
    TextDataset,
    load_dataset,
    resolve_data_dir,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _real(file: str) -> Path:
    path = DATA / file
    if not path.is_file():
        pytest.skip(f"real data file {path} is absent (shared data not mounted beside the repo)")
    return path


def _decode(blob: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))


def _check_image_dataset(ds: ImageDataset, shape: tuple[int, int], counts: tuple[int, int]) -> None:
    assert ds.modality == "image"
    for split, n in zip((ds.train, ds.test), counts, strict=True):
        assert split.images.shape == (n, *shape, 3) and split.images.dtype == np.uint8
        assert split.labels.shape == (n,) and split.labels.dtype == np.int64
    assert all(isinstance(c, str) for c in ds.class_names)
    assert ds.num_classes == len(ds.class_names)


# --- real data, small slices ----------------------------------------------------------------


def test_cifar10_slice() -> None:
    zf = zipfile.ZipFile(_real("cifar10-jpg.zip"))
    ds = load_dataset("cifar10", DATA, limit_per_class=5)
    _check_image_dataset(ds, (32, 32), (50, 50))
    assert ds.name == "cifar10"
    assert ds.class_names == (
        "airplane", "automobile", "bird", "cat", "deer",
        "dog", "frog", "horse", "ship", "truck",
    )  # fmt: skip
    assert np.array_equal(ds.train.labels, np.repeat(np.arange(10), 5))
    assert np.array_equal(ds.test.labels, ds.train.labels)
    # class-major, first files in sorted order
    assert np.array_equal(ds.train.images[0], _decode(zf.read("train/airplane/0000.jpg")))
    assert np.array_equal(ds.train.images[6], _decode(zf.read("train/automobile/0001.jpg")))
    assert np.array_equal(ds.test.images[-1], _decode(zf.read("test/truck/0004.jpg")))


def test_tinyimagenet_slice_val_labels_and_grey() -> None:
    zf = zipfile.ZipFile(_real("tinyimagenet-100.zip"))
    ds = load_dataset("tinyimagenet-100", DATA, limit_per_class=2)
    _check_image_dataset(ds, (64, 64), (200, 200))
    wnids = zf.read("tinyimagenet-100/wnids.txt").decode().split()
    assert len(wnids) == 100 == ds.num_classes == len(set(ds.class_names))
    assert ds.class_names[:3] == ("goldfish", "European fire salamander", "bullfrog")
    assert np.array_equal(np.bincount(ds.test.labels), [2] * 100)
    # Known rows of val_annotations.txt; each file is among its class's first 2 in sorted order.
    for file, wnid in [
        ("val_12.JPEG", "n02226429"),
        ("val_1230.JPEG", "n01443537"),
        ("val_1037.JPEG", "n03250847"),
    ]:
        image = _decode(zf.read(f"tinyimagenet-100/val/images/{file}"))
        rows = np.flatnonzero((ds.test.images == image).all(axis=(1, 2, 3)))
        assert len(rows) == 1 and ds.test.labels[rows[0]] == wnids.index(wnid), file
    # A grayscale JPEG (mode L) in the slice comes back with its grey replicated into RGB.
    grey = Image.open(io.BytesIO(zf.read("tinyimagenet-100/train/n02988304/n02988304_1.JPEG")))
    assert grey.mode == "L"
    row = 2 * wnids.index("n02988304") + 1  # class-major; sorted: _0, _1
    assert np.array_equal(ds.train.images[row], np.repeat(np.asarray(grey)[..., None], 3, -1))


def test_mnist_slice_is_grey_replicated() -> None:
    with np.load(_real("mnist.npz")) as npz:
        x_test, y_test = npz["x_test"], npz["y_test"]
    ds = load_dataset("mnist", DATA, limit_per_class=3)
    _check_image_dataset(ds, (28, 28), (30, 30))
    assert ds.class_names == tuple("0123456789")
    img = ds.train.images
    assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()
    expected = np.concatenate([np.flatnonzero(y_test == c)[:3] for c in range(10)])
    expected.sort()  # file order is kept
    assert np.array_equal(ds.test.labels, y_test[expected])
    assert np.array_equal(ds.test.images[..., 0], x_test[expected])


def test_ag_news_full_split_is_stratified_lossless_and_fixed() -> None:
    with _real("ag_news_test.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ds = load_dataset("ag-news", DATA)
    assert isinstance(ds, TextDataset) and ds.modality == "text"
    assert ds.class_names == ("World", "Sports", "Business", "Sci/Tech")
    assert (len(ds.train.texts), len(ds.test.texts)) == (6080, 1520)
    assert np.array_equal(np.bincount(ds.train.labels), [1520] * 4)
    assert np.array_equal(np.bincount(ds.test.labels), [380] * 4)
    assert ds.train.labels.dtype == np.int64 and all(isinstance(t, str) for t in ds.train.texts)
    expected = sorted((f"{r['title']}. {r['description']}", r["class"]) for r in rows)
    got = [
        (text, ds.class_names[label])
        for split in (ds.train, ds.test)
        for text, label in zip(split.texts, split.labels, strict=True)
    ]
    assert sorted(got) == expected  # no text lost, duplicated or relabelled
    again = load_dataset("ag-news", DATA)
    assert again.test.texts == ds.test.texts and np.array_equal(again.train.labels, ds.train.labels)


# --- data dir resolution --------------------------------------------------------------------


def test_resolve_data_dir_argument_then_env_then_default(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert resolve_data_dir(None) == tmp_path.parent / "shared" / "data"
    monkeypatch.setenv(DATA_DIR_ENV, "")  # empty counts as unset
    assert resolve_data_dir(None) == tmp_path.parent / "shared" / "data"
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "env"))
    assert resolve_data_dir(None) == tmp_path / "env"
    assert resolve_data_dir("given") == tmp_path / "given"
    assert resolve_data_dir(Path("/abs/dir")) == Path("/abs/dir")


def test_load_dataset_reads_the_env_data_dir(tmp_path: Path, monkeypatch) -> None:
    _write_csv(tmp_path / "tiny.csv", [("t", "a")] * 5 + [("u", "b")] * 5)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert load_dataset("csv:tiny").class_names == ("a", "b")


# --- generic image folders and zips ---------------------------------------------------------


def _pixels(seed: int, size: tuple[int, int] = (6, 4)) -> np.ndarray:
    """A distinct random RGB image, height x width = size."""
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def _make_folder(root: Path, size: tuple[int, int] = (6, 4)) -> dict[str, np.ndarray]:
    """train: cat x3, dog x2 (one of them a grey PNG); test: cat x1, dog x1; plus litter."""
    arrays = {
        "train/cat/a.png": _pixels(1, size),
        "train/cat/b.png": _pixels(2, size),
        "train/cat/c.png": _pixels(3, size),
        "train/dog/x.png": _pixels(4, size),
        "test/cat/m.png": _pixels(6, size),
        "test/dog/n.png": _pixels(7, size),
    }
    for name, array in arrays.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(root / name)
    grey = _pixels(5, size)[..., 0]
    Image.fromarray(grey, mode="L").save(root / "train/dog/y.png")
    arrays["train/dog/y.png"] = np.repeat(grey[..., None], 3, -1)
    (root / "train/dog/notes.txt").write_text("not an image")
    (root / "train/cat/.hidden.png").write_bytes(b"junk")
    return arrays


def _zip_folder(folder: Path, target: Path, prefix: str = "") -> None:
    with zipfile.ZipFile(target, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, prefix + path.relative_to(folder).as_posix())


def _check_folder_dataset(ds: ImageDataset, arrays: dict[str, np.ndarray], name: str) -> None:
    assert ds.name == name and ds.class_names == ("cat", "dog")
    _check_image_dataset(ds, (6, 4), (5, 2))
    train = ["train/cat/a.png", "train/cat/b.png", "train/cat/c.png"]
    train += ["train/dog/x.png", "train/dog/y.png"]
    assert np.array_equal(ds.train.images, np.stack([arrays[n] for n in train]))
    test = np.stack([arrays["test/cat/m.png"], arrays["test/dog/n.png"]])
    assert np.array_equal(ds.test.images, test)
    assert ds.train.labels.tolist() == [0, 0, 0, 1, 1] and ds.test.labels.tolist() == [0, 1]


def test_folder_dataset_from_a_folder(tmp_path: Path) -> None:
    arrays = _make_folder(tmp_path / "pets")
    _check_folder_dataset(load_dataset("folder:pets", tmp_path), arrays, "folder:pets")


@pytest.mark.parametrize("prefix", ["", "pets/"])  # flat zip, or a zipped folder
@pytest.mark.parametrize("name", ["pets", "pets.zip"])
def test_folder_dataset_from_a_zip(tmp_path: Path, prefix: str, name: str) -> None:
    arrays = _make_folder(tmp_path / "src")
    _zip_folder(tmp_path / "src", tmp_path / "pets.zip", prefix)
    _check_folder_dataset(load_dataset(f"folder:{name}", tmp_path), arrays, f"folder:{name}")


def test_folder_limit_per_class_takes_the_first_sorted_files(tmp_path: Path) -> None:
    arrays = _make_folder(tmp_path / "pets")
    ds = load_dataset("folder:pets", tmp_path, limit_per_class=1)
    assert ds.train.labels.tolist() == [0, 1] and ds.test.labels.tolist() == [0, 1]
    assert np.array_equal(ds.train.images[1], arrays["train/dog/x.png"])


def test_folder_jpeg_and_nested_class_folders(tmp_path: Path) -> None:
    """JPEGs decode as PIL decodes them; files may sit deeper (train/<class>/images/...)."""
    for split in ("train", "test"):
        path = tmp_path / "j" / split / "k" / "images" / "0.jpg"
        path.parent.mkdir(parents=True)
        Image.fromarray(_pixels(0, (16, 16))).save(path, quality=90)
    ds = load_dataset("folder:j", tmp_path)
    assert ds.class_names == ("k",)
    assert np.array_equal(ds.train.images[0], _decode(path.read_bytes()))


def test_mixed_image_sizes_are_an_error(tmp_path: Path) -> None:
    _make_folder(tmp_path / "pets")
    Image.fromarray(_pixels(9, (5, 4))).save(tmp_path / "pets/test/dog/z.png")
    sizes = r"test/dog/z\.png is 4x5 but train/cat/a\.png is 4x6"
    with pytest.raises(ValueError, match=sizes) as e:
        load_dataset("folder:pets", tmp_path)
    assert "one size" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: (d / "train/cat/a.png").write_bytes(b"not a png"), r"cannot decode .*a\.png"),
        (lambda d: shutil.rmtree(d / "test"), r"no images under test/<class>/ .*train and test"),
        (lambda d: (d / "train/dog").rename(d / "train/.dog"), r"test classes \['dog'\] have no"),
    ],
)
def test_broken_folders_say_what_is_wrong(tmp_path: Path, make, match: str) -> None:
    _make_folder(tmp_path / "pets")
    make(tmp_path / "pets")
    with pytest.raises(ValueError, match=match) as e:
        load_dataset("folder:pets", tmp_path)
    assert "'folder:pets'" in str(e.value) and "\n" not in str(e.value)


def test_a_file_that_is_not_a_zip_says_so(tmp_path: Path) -> None:
    (tmp_path / "cifar10-jpg.zip").write_bytes(b"truncated download")
    with pytest.raises(ValueError, match=r"'cifar10': .*cifar10-jpg\.zip is not a readable zip"):
        load_dataset("cifar10", tmp_path)


# --- generic CSVs ---------------------------------------------------------------------------


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


def test_csv_with_int_labels_sorts_them_numerically(tmp_path: Path) -> None:
    rows = [(f"text {i}, with a comma", str([2, 10, 1][i % 3])) for i in range(30)]
    _write_csv(tmp_path / "nums.csv", rows)
    ds = load_dataset("csv:nums", tmp_path)
    assert isinstance(ds, TextDataset) and ds.modality == "text" and ds.name == "csv:nums"
    assert ds.class_names == ("1", "2", "10")  # numeric, not string, order
    assert (len(ds.train.texts), len(ds.test.texts)) == (24, 6)
    assert np.array_equal(np.bincount(ds.test.labels), [2, 2, 2])
    got = sorted(
        (t, ds.class_names[y])
        for s in (ds.train, ds.test)
        for t, y in zip(s.texts, s.labels, strict=True)
    )
    assert got == sorted(rows)


def test_csv_with_string_labels_and_limit(tmp_path: Path) -> None:
    rows = [(f"t{i}", ["spam", "ham"][i % 2]) for i in range(40)]
    _write_csv(tmp_path / "mail.csv", rows)
    ds = load_dataset("csv:mail", tmp_path)
    assert ds.class_names == ("ham", "spam") and ds.train.labels.dtype == np.int64
    small = load_dataset("csv:mail", tmp_path, limit_per_class=5)
    texts = set(small.train.texts + small.test.texts)
    assert texts == {f"t{i}" for i in range(10)}  # first 5 rows of each class, in file order
    assert (len(small.train.texts), len(small.test.texts)) == (8, 2)
    again = load_dataset("csv:mail", tmp_path, limit_per_class=5)
    assert again.train.texts == small.train.texts  # seeded, fixed


def test_csv_extra_columns_are_ignored_and_missing_ones_named(tmp_path: Path) -> None:
    (tmp_path / "extra.csv").write_text("id,text,label\n" + "".join(f"{i},t,a\n" for i in range(5)))
    assert load_dataset("csv:extra", tmp_path).num_classes == 1
    (tmp_path / "bad.csv").write_text("sentence,label\nhello,a\n")
    columns = r"'csv:bad'.*has columns \['sentence', 'label'\], needs text, label"
    with pytest.raises(ValueError, match=columns):
        load_dataset("csv:bad", tmp_path)


def test_csv_too_small_to_split_says_so(tmp_path: Path) -> None:
    _write_csv(tmp_path / "one.csv", [("a", "x"), ("b", "x"), ("c", "y")])
    with pytest.raises(ValueError, match=r"'csv:one': cannot split 3 items stratified 80/20"):
        load_dataset("csv:one", tmp_path)


# --- names, paths and limits ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cifar10", "cifar10-jpg.zip"),
        ("tinyimagenet-100", "tinyimagenet-100.zip"),
        ("mnist", "mnist.npz"),
        ("ag-news", "ag_news_test.csv"),
        ("csv:reviews", "reviews.csv"),
        ("folder:pets", "pets or .*pets.zip"),
    ],
)
def test_missing_files_name_the_path_and_how_to_point_at_it(
    tmp_path: Path, name: str, expected: str
) -> None:
    with pytest.raises(FileNotFoundError) as e:
        load_dataset(name, tmp_path)
    message = str(e.value)
    assert message.startswith(f"dataset {name!r}: {tmp_path}/") and "\n" not in message
    assert re.search(expected, message) and "data-dir" in message and DATA_DIR_ENV in message


def test_unknown_dataset_lists_names_and_prefixes() -> None:
    with pytest.raises(ValueError) as e:
        load_dataset("cifar100")
    message = str(e.value)
    assert message.startswith("unknown dataset 'cifar100'; choose one of ")
    for allowed in (*datasets.DATASETS, "folder:<name>", "csv:<name>"):
        assert allowed in message


@pytest.mark.parametrize("name", ["folder:", "csv:../secrets", "folder:a/b", "folder:.."])
def test_prefixed_names_must_be_bare_file_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="is not allowed after the prefix; use a bare"):
        load_dataset(name, tmp_path)


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_limit_per_class_must_be_a_positive_int(limit) -> None:
    with pytest.raises(ValueError, match=rf"limit_per_class={limit!r} is not allowed"):
        load_dataset("digits", limit_per_class=limit)


def test_digits_ignores_the_data_dir_and_takes_a_limit(tmp_path: Path) -> None:
    full = load_dataset("digits", tmp_path / "nowhere")
    assert full.modality == "image" and len(full.train.labels) == 1437
    small = load_dataset("digits", limit_per_class=2)
    assert np.array_equal(np.bincount(small.train.labels), [2] * 10)
    keep = np.sort(np.concatenate([np.flatnonzero(full.train.labels == c)[:2] for c in range(10)]))
    assert np.array_equal(small.train.images, full.train.images[keep])  # first 2, order kept


# --- the hub layouts of the registered files ------------------------------------------------


def test_tinyimagenet_hub_layout_with_images_subfolders(tmp_path: Path) -> None:
    """The original tiny-imagenet-200.zip nests train images in images/ beside a boxes file."""
    root, wnids = "tiny-imagenet-200/", ["n02", "n01"]  # wnids.txt order is the class order
    with zipfile.ZipFile(tmp_path / "tinyimagenet-100.zip", "w") as zf:
        zf.writestr(f"{root}wnids.txt", "\n".join(wnids) + "\n")
        zf.writestr(f"{root}words.txt", "n00\tentity\nn01\tcrane, derrick\nn02\tcrane, bird\n")
        annotations = []
        for k, wnid in enumerate(wnids):
            zf.writestr(f"{root}train/{wnid}/{wnid}_boxes.txt", "box")
            for i in range(2):
                zf.writestr(f"{root}train/{wnid}/images/{wnid}_{i}.JPEG", _png(10 * k + i))
                zf.writestr(f"{root}val/images/val_{2 * k + i}.JPEG", _png(100 + 10 * k + i))
                annotations.append(f"val_{2 * k + i}.JPEG\t{wnid}\t0\t0\t3\t5")
        zf.writestr(f"{root}val/val_annotations.txt", "\n".join(annotations[::-1]))
    ds = load_dataset("tinyimagenet-100", tmp_path)
    assert ds.class_names == ("crane, bird", "crane, derrick")  # first synonyms collide
    assert ds.train.labels.tolist() == [0, 0, 1, 1] == ds.test.labels.tolist()
    assert np.array_equal(ds.test.images[3], _pixels(111))
    assert np.array_equal(ds.train.images[0], _pixels(0))


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(_pixels(seed)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_ag_news_with_original_1_based_classes(tmp_path: Path) -> None:
    lines = [f'"t{i}","d{i}",{i % 4 + 1}' for i in range(20)]
    (tmp_path / "ag_news_test.csv").write_text("title,description,class\n" + "\n".join(lines))
    ds = load_dataset("ag-news", tmp_path)
    texts = dict(zip(ds.train.texts + ds.test.texts, [*ds.train.labels, *ds.test.labels]))
    assert texts["t0. d0"] == 0 and texts["t7. d7"] == 3  # class 1 -> World, 4 -> Sci/Tech
    (tmp_path / "ag_news_test.csv").write_text("title,description,class\nt,d,5\n")
    with pytest.raises(ValueError, match=r"class '5' is not allowed; use one of World, .* or 1..4"):
        load_dataset("ag-news", tmp_path)
