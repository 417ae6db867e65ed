"""The numpy backend's copy between arrays of one size, whatever their shapes and strides."""

from collections.abc import Callable

import numpy as np
import pytest

from collectives.backends.numpy_backend import NumpyBackend


def _strided(shape: tuple[int, ...]) -> np.ndarray:
    """A non-contiguous view of ``shape``: every other column of a wider array."""
    wide = np.zeros((*shape[:-1], 2 * shape[-1]))
    return wide[..., ::2]


@pytest.mark.parametrize(
    ("make_dst", "src"),
    [
        (lambda: np.zeros((3, 4)), np.arange(12.0).reshape(3, 4)),  # one shape
        (lambda: np.zeros((3, 4)), np.arange(12.0)),  # contiguous destination, another shape
        (lambda: np.zeros(12), np.arange(12.0).reshape(4, 3)),
        (lambda: _strided((4, 3)), np.arange(12.0)),  # strided destination: the source takes its shape
        (lambda: _strided((2, 6)), np.arange(24.0)[::2].reshape(3, 4)),  # both strided
    ],
)
def test_a_copy_writes_the_sources_elements_into_the_destination_in_order(
    make_dst: Callable[[], np.ndarray], src: np.ndarray
) -> None:
    dst = make_dst()
    NumpyBackend().copy(dst, src)
    assert dst.ravel().tolist() == src.ravel().tolist()
    if dst.base is not None:  # the view was written through, not a copy of it
        assert sorted(dst.base.ravel().tolist()) == sorted([0.0] * src.size + src.ravel().tolist())
