"""The array backends' copy between arrays of one size, whatever their shapes and strides.

numpy's, and CuPy's on a GPU (marked ``gpu``) and on tests/host_cuda.py's stand-in.
"""

from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest

from collectives.backends import backend_for
from tests import host_cuda


@pytest.fixture(params=["numpy", *host_cuda.KINDS])
def xp(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The array library: numpy, or CuPy (on a GPU, or the stand-in installed as ``cupy``)."""
    if request.param == "numpy":
        yield np
        return
    with host_cuda.cupy_for(request.param) as module:
        yield module


def _host(xp: ModuleType, array: object) -> np.ndarray:
    return array if xp is np else xp.asnumpy(array)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("dst_shape", "padded", "src"),
    [
        ((3, 4), False, np.arange(12.0).reshape(3, 4)),  # one shape
        ((3, 4), False, np.arange(12.0)),  # a contiguous destination of another shape
        ((12,), False, np.arange(12.0).reshape(4, 3)),
        ((4, 3), True, np.arange(12.0)),  # a padded destination: the source takes its shape
        ((2, 6), True, np.arange(12.0).reshape(3, 4)),
    ],
)
def test_a_copy_writes_the_sources_elements_into_the_destination_in_order(
    xp: ModuleType, dst_shape: tuple[int, ...], padded: bool, src: np.ndarray
) -> None:
    # a padded destination: all but the last column of a wider array (no flat view of it), written through
    whole = xp.zeros((*dst_shape[:-1], dst_shape[-1] + 1)) if padded else xp.zeros(dst_shape)
    dst = whole[..., :-1] if padded else whole
    backend_for(dst).copy(dst, xp.asarray(src))
    assert _host(xp, dst).ravel().tolist() == src.ravel().tolist()
    if padded:
        assert _host(xp, whole)[..., -1].ravel().tolist() == [0.0] * dst_shape[0]  # the padding untouched
        assert _host(xp, whole)[..., :-1].ravel().tolist() == src.ravel().tolist()
