"""Reduction ops and dtypes, and their sizes."""

import numpy as np
import pytest

from collectives import OPS, UnsupportedDtypeError, UnsupportedOpError
from collectives.ops import DTYPES, FLOAT_DTYPES, INTEGER_DTYPES, check_dtype, get_op, itemsize


def test_every_op_is_defined_for_the_dtypes_the_issue_names() -> None:
    assert set(DTYPES) == set(FLOAT_DTYPES) | set(INTEGER_DTYPES)
    for name in ("sum", "prod", "min", "max"):
        assert OPS[name].dtypes == DTYPES
    assert OPS["avg"].dtypes == FLOAT_DTYPES
    for name in ("band", "bor", "bxor"):
        assert OPS[name].dtypes == INTEGER_DTYPES


def test_avg_combines_by_sum_and_averages() -> None:
    assert get_op("avg").combine == "sum"
    assert get_op("avg").averages
    assert not get_op("sum").averages


def test_unknown_op_lists_the_valid_ones() -> None:
    with pytest.raises(UnsupportedOpError, match=r"unknown op 'mean'; valid ops are sum, prod"):
        get_op("mean")


def test_op_that_does_not_fit_the_dtype_names_both() -> None:
    with pytest.raises(UnsupportedOpError, match="op 'bxor' does not apply to float32"):
        get_op("bxor").check_dtype("float32")
    with pytest.raises(UnsupportedOpError, match="op 'avg' does not apply to int32"):
        get_op("avg").check_dtype("int32")


@pytest.mark.parametrize("dtype", ["complex64", "bool", "object", "float128"])
def test_unsupported_dtypes_are_named(dtype: str) -> None:
    with pytest.raises(UnsupportedDtypeError, match=f"unsupported dtype {dtype}"):
        check_dtype(dtype)


def test_itemsize() -> None:
    names = ("int8", "uint16", "bfloat16", "float32", "float64")
    assert [itemsize(name) for name in names] == [1, 2, 2, 4, 8]
    assert itemsize(np.dtype(np.int64)) == 8
    with pytest.raises(UnsupportedDtypeError, match="unsupported dtype complex64"):
        itemsize("complex64")
