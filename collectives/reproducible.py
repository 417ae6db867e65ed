"""Reproducible sums: floats to integer-valued words under an agreed exponent, and back, rounded once.

Each element gets a *code*: its magnitude's exponent on a grid of ``GRID`` bits,
``t = ceil(E / GRID)`` for ``|x| < 2**E``. The ranks agree on the largest code of
each element (a max-allreduce of int8), which fixes the element's unit
``2**T``, ``T = GRID * t - BITS``, with ``BITS`` value bits (47 for float16,
bfloat16 and float32, 94 in two words for float64). Every contribution is cut to
a whole number of units, toward zero, which is exact in integers below
``2**BITS``; those integers are summed exactly, in any order (integer addition is
associative, and so is float64 addition of such integers while the sum stays
below 2**53), and the sum is rounded once to the dtype, to nearest even. The
result depends only on the multiset of contributions.

Special codes: ``SPECIAL`` (127) for inf and NaN, ``family.negative_zero`` (one
below the lowest grid step) for -0.0 and ``EMPTY`` (-128) for no contribution,
so that the max over the ranks says "some contribution is inf or NaN" and
"every contribution is -0.0" at no extra cost.

An accumulator (:class:`Levels`) does not know the agreed code while it adds, so
it keeps ``family.levels`` sums per element, cut at its own largest code so far and
at the grid steps above; the agreed code picks one (or none, when it is more steps
above than that). A step up of its own code moves
the sums down a level: cutting at a grid point depends only on the contribution
and that point, so the order of the adds never matters.
"""

__all__ = [
    "BITS_OF",
    "EMPTY",
    "EXACT_IN_FLOAT64",
    "FAMILIES",
    "GRID",
    "MOST_CONTRIBUTIONS",
    "SPECIAL",
    "Family",
    "Levels",
    "codes_of",
    "family_of",
    "finish",
    "float64_sums",
    "gathered_message",
    "kernels",
    "name_of",
    "rows_sum",
    "special_bits",
    "words_of",
]

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import engine
from .errors import UnsupportedDtypeError

GRID = 16
"""Bits per step of the agreed exponent."""

WORD = 47
"""Value bits per int64 word: 2**16 contributions of less than 2**47 sum below 2**63."""


MOST_CONTRIBUTIONS = 1 << 15
"""The most contributions one sum takes (ranks times an accumulator's adds), so no word overflows."""

EXACT_IN_FLOAT64 = 1 << (53 - WORD)
"""The most contributions whose float32-family sum float64 holds exactly (sent as float64, not int64)."""

EMPTY = -128
"""The code of an element without contributions."""

SPECIAL = 127
"""The code of an element with an infinity or a NaN."""

BITS_OF = {"float16": 1, "bfloat16": 2, "float32": 3, "float64": 4}
"""Each dtype's number in the ranks' agreement on the call (the dtype's name would need a collective)."""

_NAN, _PLUS_INF, _MINUS_INF = 1, 2, 4


@dataclass(frozen=True)
class Family:
    """How one kind of float is cut into words: float32 (float16, bfloat16 too) or float64."""

    name: str
    work: Any  # the numpy dtype the conversion computes in
    words: int  # int64 words per element
    lowest: int  # the lowest grid step: cutting there is exact for every value of the dtype
    top: int  # the highest code of a finite value
    exponent_bits: int  # the position of the exponent field
    bias: int  # the exponent field's
    negative_zero_bits: int  # -0.0's bits as a signed integer: the least one
    unsigned: Any
    signed: Any

    @property
    def bits(self) -> int:
        """Value bits of an element's words together."""
        return WORD * self.words

    @property
    def levels(self) -> int:
        """An accumulator's sums per element: its cuts at its own code and the grid steps above that
        can still hold some of a contribution (3 for the float32 family, 6 for float64)."""
        return -(-self.bits // GRID)

    @property
    def negative_zero(self) -> int:
        """The code of -0.0: below every other contribution's, so the max is it only if all are -0.0."""
        return self.lowest - 1


def _family(
    name: str, work: Any, words: int, mantissa: int, exponent: int, unsigned: Any, signed: Any
) -> Family:
    bias = (1 << (exponent - 1)) - 1
    lowest = (WORD * words - (mantissa + bias - 1)) // GRID  # GRID * lowest - bits <= the least subnormal's E
    top = -(-((1 << exponent) - 1 - bias) // GRID)  # the largest finite field's code (E = 2**e - 1 - bias)
    least = int(np.iinfo(signed).min)
    return Family(name, np.dtype(work), words, lowest, top, mantissa, bias, least, unsigned, signed)


FAMILIES = {
    "float32": _family("float32", np.float32, 1, 23, 8, np.uint32, np.int32),
    "float64": _family("float64", np.float64, 2, 52, 11, np.uint64, np.int64),
}


_NAMES: dict[Any, str] = {}


def name_of(dtype: Any) -> str:
    """``dtype.name``, remembered: numpy builds the name anew on every access, microseconds a call."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def family_of(dtype_name: str) -> Family:
    """The family a float dtype is converted in."""
    if dtype_name not in BITS_OF:
        raise UnsupportedDtypeError(
            f"a reproducible sum takes float16, bfloat16, float32 or float64, not {dtype_name}"
        )
    return FAMILIES["float64" if dtype_name == "float64" else "float32"]


def kernels() -> Any:
    """The compiled engine where it runs and has the conversion's loops (``repro_*``), else ``None``.

    Read at each call, so that ``engine.COMPILED`` set to ``None`` turns them off; they give
    the numpy path's bits.
    """
    built = engine.COMPILED
    return built if built is not None and hasattr(built, "repro_rows") else None


def codes_of(x: np.ndarray, family: Family) -> np.ndarray:
    """Each element's code (int8), of a flat array of the family's working dtype.

    ``ceil(E / GRID)`` for ``|x| < 2**E``, ``E = field + 1 - bias`` (a subnormal's as the
    least normal's), computed on the exponent field: ``(field + GRID - bias) >> 4``.
    """
    compiled = kernels()
    if compiled is not None:
        made = np.empty(x.size, np.int8)
        compiled.repro_codes(x, made)
        return made
    signed = x.view(family.signed)
    shift = family.exponent_bits
    field = signed & family.signed(((1 << (8 * signed.itemsize - 1)) - 1) >> shift << shift)
    field += family.signed((GRID - family.bias) << shift)
    field >>= shift + 4
    codes: np.ndarray = field.astype(np.int8)
    if (GRID - family.bias) >> 4 < family.lowest:  # float64's smallest exponents cut exactly one step up
        np.maximum(codes, family.lowest, out=codes)
    if codes.size and codes.max() > family.top:  # inf or NaN: the exponent field all ones
        codes[codes > family.top] = SPECIAL
    least = family.negative_zero_bits
    if signed.size and signed.min() == least:
        codes[signed == least] = family.negative_zero
    return codes


def special_bits(x: np.ndarray) -> np.ndarray:
    """Per element: 1 for a NaN, 2 for +inf, 4 for -inf (uint8), to be or-reduced."""
    bits = np.zeros(x.size, np.uint8)
    bits[np.isnan(x)] = _NAN
    bits[x == np.inf] |= _PLUS_INF
    bits[x == -np.inf] |= _MINUS_INF
    return bits


def _finite(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``x`` with its elements of code ``SPECIAL`` zeroed (a copy only if there are some)."""
    special = codes == SPECIAL
    if not special.any():
        return x
    return np.where(special, 0, x).astype(x.dtype)


def _scales(codes: np.ndarray, family: Family) -> np.ndarray:
    """``-T`` of each element's unit (int32), for ``np.ldexp``.

    Only grid steps' are meaningful: at ``SPECIAL`` every contribution is zeroed first,
    and at -0.0's code every one is a zero.
    """
    scales: np.ndarray = np.multiply(codes, -GRID, dtype=np.int32)
    scales += family.bits
    return scales


def words_of(x: np.ndarray, codes: np.ndarray, family: Family, wire: Any) -> np.ndarray:
    """A flat array's contributions cut at the agreed ``codes``: what the ranks sum.

    ``wire`` float64 (float32 family, at most ``EXACT_IN_FLOAT64`` contributions):
    the cut values themselves, as float64; int64: the whole units, one word per
    element (float32 family) or two, interleaved high and low (float64).
    """
    compiled = kernels()
    if compiled is not None:
        made = np.empty(x.size * (1 if wire is np.float64 else family.words), wire)
        compiled.repro_words(x, codes, made)
        return made
    x = _finite(x, codes)
    scale = _scales(codes, family)
    scaled = np.ldexp(x, scale)
    if wire is np.float64:
        np.trunc(scaled, out=scaled)
        np.ldexp(scaled, -scale, out=scaled)
        cut: np.ndarray = np.add(scaled, 0.0, dtype=np.float64)  # and -0.0 (a cut negative) becomes +0.0
        return cut
    if family.words == 1:
        whole: np.ndarray = scaled.astype(np.int64)
        return whole
    words = np.empty((x.size, 2), np.int64)
    high = np.trunc(np.ldexp(scaled, -WORD))
    words[:, 0] = high
    words[:, 1] = scaled - np.ldexp(high, WORD)  # exact: the bits of ``scaled`` below 2**WORD
    return words.reshape(-1)


def float64_sums(words: np.ndarray, codes: np.ndarray, family: Family) -> np.ndarray:
    """An accumulator's float32-family words (whole units) as the float64 values they stand for."""
    values: np.ndarray = np.ldexp(words.astype(np.float64), -_scales(codes, family))
    return values


class Levels:
    """An accumulator's state: its codes so far, and ``family.levels`` sums of its cut contributions."""

    __slots__ = ("adds", "codes", "count", "family", "levels", "specials")

    def __init__(self, count: int, family: Family) -> None:
        self.family = family
        self.count = count
        self.adds = 0
        self.codes = np.full(count, EMPTY, np.int8)
        self.levels = np.zeros((family.levels, count * family.words), np.int64)
        self.specials: np.ndarray | None = None

    def add(self, x: np.ndarray) -> None:
        """Add a flat contiguous array of a dtype of the family as one contribution.

        The compiled engine's ``repro_add`` does it in one pass where it runs (float16 and
        bfloat16 widened as it goes; an engine built before it had one runs the numpy path),
        with the same bits.
        """
        compiled = kernels()
        if compiled is not None and hasattr(compiled, "repro_add"):
            kind = BITS_OF[name_of(x.dtype)]
            raw = x.view(np.uint16) if kind < BITS_OF["float32"] else x
            special = compiled.repro_add(raw, self.codes, self.levels, self.specials, kind)
            if special and self.specials is None:  # the first inf or NaN: no bytes to mark before
                self.specials = special_bits(x.astype(self.family.work))
            self.adds += 1
            return
        x = np.ascontiguousarray(x, dtype=self.family.work)
        family = self.family
        codes = codes_of(x, family)
        if (codes == SPECIAL).any():
            bits = special_bits(x)
            self.specials = bits if self.specials is None else self.specials | bits
            x = _finite(x, codes)
        raised = np.maximum(self.codes, codes)
        if not np.array_equal(raised, self.codes):
            self._lift(raised)
        if self.specials is not None:  # an element an earlier add made special takes nothing more
            x = _finite(x, raised)
        scaled = np.ldexp(x, _scales(raised, family))
        step = family.work.type(2.0**-GRID)
        for level in self.levels:
            if family.words == 1:
                np.add(level, scaled, out=level, dtype=np.int64, casting="unsafe")
            else:
                pair = level.reshape(-1, 2)
                high = np.trunc(np.ldexp(scaled, -WORD))
                np.add(pair[:, 0], high, out=pair[:, 0], dtype=np.int64, casting="unsafe")
                low = scaled - np.ldexp(high, WORD)
                np.add(pair[:, 1], low, out=pair[:, 1], dtype=np.int64, casting="unsafe")
            scaled *= step  # exact, or a value below one unit, which cuts to 0 either way
        self.adds += 1

    def _lift(self, raised: np.ndarray) -> None:
        """Move each element's sums down by the steps its code rose (the lowest ones drop out)."""
        steps = raised.astype(np.int16) - self.codes
        self.codes = raised
        words, levels = self.family.words, self.family.levels
        for by in range(1, levels):
            moved = np.repeat(steps == by, words)
            if moved.any():
                self.levels[: levels - by, moved] = self.levels[by:, moved]
                self.levels[levels - by :, moved] = 0
        gone = np.repeat(steps >= levels, words)
        if gone.any():
            self.levels[:, gone] = 0

    def words(self, agreed: np.ndarray) -> np.ndarray:
        """The sums cut at the ``agreed`` codes, whole units (int64; two words an element for float64)."""
        levels = self.family.levels
        level = np.repeat(np.clip(agreed.astype(np.int16) - self.codes, 0, levels), self.family.words)
        picked = np.zeros(self.levels.shape[1], np.int64)
        for index in range(levels):
            np.copyto(picked, self.levels[index], where=level == index)
        return picked


def _one_word(high: np.ndarray, low: np.ndarray, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(high * 2**WORD + low) * 2**unit`` as one int64 ``S * 2**unit'`` of at most 62 bits.

    Bits cut off below are kept as a sticky last bit (``S`` is odd then): the value
    lies strictly between the same two numbers of 60 bits as ``S`` does, so rounding
    ``S`` to 55 bits or fewer rounds the value alike.
    """
    carry = low >> WORD
    low = low - (carry << WORD)  # 0 <= low < 2**WORD
    high = high + carry
    top = np.frexp(np.abs(high).astype(np.float64))[1].astype(np.int64)  # bits of |high|, or one more
    cut = np.maximum(top - 13, 0)  # so that |S| < 2**61
    if not cut.any():
        return (high << WORD) + low, unit
    part = np.minimum(cut, WORD)
    kept = (high << (WORD - part)) + (low >> part)
    sticky = (low & ((np.int64(1) << part) - 1)) != 0
    beyond = cut > WORD  # only past 2**13 contributions near the largest value
    if beyond.any():
        more = np.minimum(np.maximum(cut - WORD, 0), 62)
        kept = np.where(beyond, high >> more, kept)
        sticky |= beyond & (((high & ((np.int64(1) << more) - 1)) != 0) | (low != 0))
    return 2 * kept + sticky, unit + cut - 1


def _odd(whole: np.ndarray) -> np.ndarray:
    """Int64s (below 2**62) to float64 rounded to odd: toward zero, the last bit set where inexact."""
    value = whole.astype(np.float64)
    rest = whole - value.astype(np.int64)
    inexact = rest != 0
    bits = value.view(np.int64)
    bits -= inexact & ((rest ^ whole) < 0)  # rounded away from zero: one step back
    bits |= inexact
    return value


def _rounded(whole: np.ndarray, unit: np.ndarray, precision: int) -> np.ndarray:
    """``whole * 2**unit`` as float64: to nearest (``precision`` 53), else rounded to odd for one more
    rounding to ``precision`` bits, which is then correct (53 >= precision + 2)."""
    if precision < 53:
        odd: np.ndarray = np.ldexp(_odd(whole), unit.astype(np.int32))
        return odd
    value: np.ndarray = np.ldexp(whole.astype(np.float64), unit.astype(np.int32))
    tiny = (np.abs(value) < 2.0**-1022) & (whole != 0)
    if tiny.any():  # a subnormal: rounded once at 2**-1074, not at 53 bits and again
        drop = np.minimum(-1074 - unit[tiny], 63)
        small = whole[tiny]
        kept = np.where(drop > 0, small >> np.clip(drop, 0, 62), small << np.clip(-drop, 0, 62))
        rest = small - (kept << np.clip(drop, 0, 62))
        half = np.int64(1) << np.clip(drop - 1, 0, 62)
        up = (drop > 0) & ((rest > half) | ((rest == half) & ((kept & 1) == 1)))
        kept = np.where(drop >= 63, 0, kept + up)
        value[tiny] = np.ldexp(kept.astype(np.float64), -1074)
    return value


_PRECISION = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
_DIRECT = ("float32", "float64")  # dtypes the compiled finish rounds to itself; numpy rounds the others


def _to_dtype(value: np.ndarray, dtype: Any) -> np.ndarray:
    """Float64 values rounded once to ``dtype`` (nearest even; bfloat16 through float32 rounded to odd)."""
    with np.errstate(over="ignore"):
        if name_of(dtype) != "bfloat16":
            return value.astype(dtype)
        single = value.astype(np.float32)
        wide = single.astype(np.float64)
        bits = single.view(np.int32)
        away = np.abs(wide) > np.abs(value)  # rounded away from zero: back one toward it, then mark odd
        bits -= away
        bits |= (wide != value) & np.isfinite(single)
        return single.astype(dtype)


def finish(
    sums: np.ndarray,
    codes: np.ndarray,
    family: Family,
    dtype: Any,
    *,
    divide_by: int = 1,
    specials: np.ndarray | None = None,
) -> np.ndarray:
    """The summed words of elements with agreed ``codes``, rounded once to ``dtype`` (flat).

    ``divide_by`` > 1 (``avg``): the sum rounded to float64, divided, then rounded to
    ``dtype``. ``specials``: the or-reduced :func:`special_bits`, where a code is ``SPECIAL``.
    """
    compiled = kernels()
    if compiled is not None:
        name = name_of(dtype)
        to_odd = _PRECISION["float64" if divide_by > 1 else name] < 53
        made = np.empty(codes.size, dtype if name in _DIRECT else np.float64)
        compiled.repro_finish(np.ascontiguousarray(sums), codes, made, to_odd, divide_by, specials)
        return made if name in _DIRECT else _to_dtype(made, dtype)
    if sums.dtype == np.float64:  # the float32 family's exact sums
        value = sums
    else:
        unit = -_scales(codes, family).astype(np.int64)
        precision = _PRECISION["float64" if divide_by > 1 else name_of(dtype)]
        whole = sums
        if family.words == 2:  # below 2**62 with at most MOST_CONTRIBUTIONS words of 2**47
            pair = sums.reshape(-1, 2)
            whole, unit = _one_word(pair[:, 0], pair[:, 1], unit)
        with np.errstate(over="ignore"):
            value = _rounded(whole, unit, precision)
    if divide_by > 1:
        value = value / divide_by
    result = _to_dtype(value, dtype)
    negative_zero = codes == family.negative_zero
    if negative_zero.any():
        result[negative_zero] = -0.0
    special = codes == SPECIAL
    if special.any():
        bits = np.zeros(codes.size, np.uint8) if specials is None else specials
        nan = ((bits & _NAN) != 0) | ((bits & (_PLUS_INF | _MINUS_INF)) == (_PLUS_INF | _MINUS_INF))
        value = np.where(nan, np.nan, np.where((bits & _PLUS_INF) != 0, np.inf, -np.inf))
        result[special] = value[special].astype(dtype)
    return result


def gathered_message(
    flat: np.ndarray, family: Family, size: int, rank: int, trailer: tuple[int, int]
) -> np.ndarray:
    """A gathered sum's message: a row a rank, zero but this rank's, which holds ``flat``'s bits (as
    signed integers of its size) and then ``trailer``; or-reduced, it holds every rank's row."""
    message = np.empty((size, flat.size + 2), family.signed if family.words == 1 else np.int64)
    compiled = engine.COMPILED
    if compiled is not None and hasattr(compiled, "repro_pack"):
        compiled.repro_pack(flat, message, rank, *trailer)
        return message
    message.fill(0)
    message[rank, : flat.size] = flat.view(message.dtype)
    message[rank, flat.size :] = trailer
    return message


def rows_sum(
    message: np.ndarray, count: int, family: Family, dtype: Any, *, divide_by: int = 1, into: Any = None
) -> np.ndarray | None:
    """The reproducible sum of every rank's raw contribution, gathered: ``None`` where the trailers differ.

    ``message`` has a row a rank (at most ``EXACT_IN_FLOAT64`` rows): its ``count``
    elements of the family's working dtype, seen as signed integers of that size, then a
    trailer the rows must agree on. The result's bits are those of the distributed sum
    (codes agreed, words summed, one rounding): the same arithmetic, done here. ``into``: a
    C-contiguous array of ``dtype`` and ``count`` elements to write the result to, if the
    compiled engine runs and ``dtype`` is float32 or float64 (else the result is new).
    """
    size = message.shape[0]
    compiled = kernels()
    if compiled is not None:
        name = name_of(dtype)
        to_odd = _PRECISION["float64" if divide_by > 1 else name] < 53
        direct = name in _DIRECT
        made = into if direct and into is not None else np.empty(count, dtype if direct else np.float64)
        if not compiled.repro_rows(message, size, count, made, to_odd, divide_by):
            return None
        return made if direct else _to_dtype(made, dtype)
    trailers = message[:, count:]
    if not (trailers == trailers[0]).all():
        return None
    rows = [row[:count].view(family.work) for row in message]
    agreed = np.maximum.reduce([codes_of(row, family) for row in rows])
    wire = np.float64 if family.words == 1 and size <= EXACT_IN_FLOAT64 else np.int64
    sums = np.add.reduce([words_of(row, agreed, family, wire) for row in rows])
    specials = None
    if (agreed == SPECIAL).any():
        specials = np.bitwise_or.reduce([special_bits(row) for row in rows])
    return finish(sums, agreed, family, dtype, divide_by=divide_by, specials=specials)
