"""The names both apps agree on, and arrays to records."""

import numpy as np
import pytest
from flwr.app import Array

from ovalp_flwr.federation import protocol as p


@pytest.mark.parametrize("array", [
    np.random.default_rng(1).standard_normal((100, 1280)).astype(np.float32),
    np.arange(12).reshape(3, 4)[:, ::2], np.asfortranarray(np.ones((3, 4))), np.array([7.0]),
    np.zeros((0, 3), np.float16), np.array([1, 2], np.uint8)])
def test_records_hold_np_saves_bytes(array):
    """to_record's fast encoding is Array(ndarray)'s, byte for byte (anything decodes it: np.load)."""
    ours = p.to_record({"x": array})["x"]
    flowers = Array(np.ascontiguousarray(array))
    assert (ours.data, ours.dtype, ours.shape, ours.stype) == (
        flowers.data, flowers.dtype, flowers.shape, flowers.stype)
    decoded = p.from_record(p.to_record({"x": array}))["x"]
    assert np.array_equal(decoded, array) and decoded.dtype == array.dtype


ARRAYS = [np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32),
          np.arange(12, dtype=np.int64).reshape(3, 4), np.zeros(0, np.float64),
          np.array(2.5, np.float32), np.asfortranarray(np.ones((3, 4), np.float16)),
          np.array([True, False])]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_a_view_is_what_flower_decodes_without_a_copy(array):
    record = Array(array)
    view = p.view_array(record)
    expected = record.numpy()
    assert view.dtype == expected.dtype and view.shape == expected.shape
    assert np.array_equal(view, expected) and not view.flags.writeable
    assert np.array_equal(p.from_record(p.ArrayRecord({"x": record}))["x"], expected)
