"""Inputs hard to sum the same way twice, and an exact model of the reproducible sum to check against.

The model is written from the definition in docs/determinism.md, in Python's exact
integers and fractions, one element at a time, independently of the library's numpy code.
"""

__all__ = ["DTYPES", "contributions", "model", "rounded", "spread"]

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

DTYPES = ["float16", "bfloat16", "float32", "float64"]
_GRID = 16
_FAMILY = {"float64": (94, -62)}  # value bits, lowest grid step
_FLOAT32_FAMILY = (47, -7)
_ROUNDING = {  # precision, exponent of the smallest subnormal, largest finite value
    "float16": (11, -24, 65504.0),
    "bfloat16": (8, -133, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
    "float32": (24, -149, float(np.finfo(np.float32).max)),
    "float64": (53, -1074, float(np.finfo(np.float64).max)),
}


def _dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def contributions(
    dtype: str, how_many: int, count: int, seed: int, specials: bool = True
) -> list[np.ndarray]:
    """``how_many`` arrays of ``count`` elements: magnitudes across the dtype's range, sums that cancel
    to a tiny remainder, subnormals, zeros of both signs and (with ``specials``) infinities and NaN."""
    rng = np.random.default_rng(seed)
    precision, least, top = _ROUNDING[dtype]
    high = math.frexp(top)[1]
    exponents = rng.integers(least + precision - 1, high, size=(how_many, count))
    values = rng.uniform(1.0, 2.0, size=(how_many, count)) * np.exp2(exponents - 1.0)
    values *= rng.choice([-1.0, 1.0], size=values.shape)
    kind = rng.integers(0, 10, size=count)
    scale = np.exp2(rng.integers(least + precision, high - 4, size=count) - 0.0)
    narrow = rng.normal(size=(how_many, count)) * scale  # one magnitude an element
    values = np.where(kind < 3, narrow, values)
    cancel = kind == 3  # x, -x, x, -x, ... and one small remainder
    signs = np.where(np.arange(how_many) % 2 == 0, 1.0, -1.0)[:, None]
    values[:, cancel] = signs * narrow[:1, cancel]
    if how_many % 2:
        values[-1, cancel] = narrow[-1, cancel] * 2.0 ** -(precision + 3)
    tiny = rng.uniform(0, 4, size=(how_many, int((kind == 4).sum())))
    values[:, kind == 4] = tiny * 2.0**least  # subnormals
    zeros = rng.random(size=values.shape) < 0.08
    values[zeros] = np.where(rng.random(size=int(zeros.sum())) < 0.5, 0.0, -0.0)
    values[:, kind == 5] = -0.0
    if specials:
        odd = rng.random(size=values.shape)
        values[odd < 0.004] = np.nan
        values[(odd >= 0.004) & (odd < 0.008)] = np.inf
        values[(odd >= 0.008) & (odd < 0.012)] = -np.inf
    with np.errstate(over="ignore"):
        return [row.astype(_dtype(dtype)) for row in values]


def spread(how_many: int, size: int, seed: int) -> list[list[int]]:
    """The indices ``0..how_many-1`` dealt to ``size`` ranks unevenly (some may get none), by ``seed``."""
    owners = np.random.default_rng(seed).integers(0, size, size=how_many)
    return [[i for i in range(how_many) if owners[i] == rank] for rank in range(size)]


def _code(value: float, lowest: int) -> int:
    if value == 0:
        return lowest - 1 if math.copysign(1.0, value) < 0 else lowest
    return max(-(-math.frexp(value)[1] // _GRID), lowest)


def rounded(exact: Fraction, dtype: str) -> float:
    """``exact`` rounded to ``dtype``, to nearest even, with its subnormals and overflow to infinity."""
    if exact == 0:
        return 0.0
    precision, least, top = _ROUNDING[dtype]
    size = abs(exact)
    exponent = size.numerator.bit_length() - size.denominator.bit_length()
    while Fraction(2) ** exponent > size:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= size:
        exponent += 1
    step = Fraction(2) ** max(exponent - precision + 1, least)
    kept = round(size / step) * step  # Fraction's round: halves to even
    sign = 1.0 if exact > 0 else -1.0
    return sign * (math.inf if kept > top else float(kept))


def model(parts: list[np.ndarray], dtype: str, divide_by: int = 1) -> np.ndarray:
    """The reproducible sum of ``parts`` by its definition: one element at a time, exactly."""
    bits, lowest = _FAMILY.get(dtype, _FLOAT32_FAMILY)
    values = [[float(v) for v in part.astype(np.float64)] for part in parts]
    out = []
    for column in zip(*values, strict=True):
        if any(math.isnan(v) for v in column) or (math.inf in column and -math.inf in column):
            out.append(math.nan)
            continue
        if math.inf in column or -math.inf in column:
            out.append(math.inf if math.inf in column else -math.inf)
            continue
        code = max((_code(v, lowest) for v in column), default=lowest)
        if code == lowest - 1:
            out.append(-0.0)
            continue
        unit = Fraction(2) ** (_GRID * code - bits)
        total = sum(math.trunc(Fraction(v) / unit) for v in column) * unit
        if divide_by > 1:
            out.append(rounded(Fraction(rounded(total, "float64") / divide_by), dtype))
        else:
            out.append(rounded(total, dtype))
    with np.errstate(over="ignore"):
        return np.array(out, np.float64).astype(_dtype(dtype))
