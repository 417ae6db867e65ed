"""Reduction ops and the dtypes they apply to."""

__all__ = [
    "DTYPES",
    "FLOAT_DTYPES",
    "INTEGER_DTYPES",
    "OPS",
    "ReduceOp",
    "check_dtype",
    "get_op",
    "itemsize",
]

from dataclasses import dataclass

from .errors import UnsupportedDtypeError, UnsupportedOpError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INTEGER_DTYPES = (
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
)  # fmt: skip
DTYPES = FLOAT_DTYPES + INTEGER_DTYPES


@dataclass(frozen=True)
class ReduceOp:
    """An associative, commutative element-wise reduction.

    Attributes:
        name: the name users pass (``"sum"``, ``"max"``, ...).
        combine: the binary op applied when two contributions meet; ``avg``
            combines with ``sum`` and divides by the world size once at the end.
        dtypes: the dtype names the op is defined for.
    """

    name: str
    combine: str
    dtypes: tuple[str, ...]

    @property
    def averages(self) -> bool:
        """Whether the result is divided by the world size after combining."""
        return self.name == "avg"

    def check_dtype(self, dtype: str) -> None:
        """Raise if this op cannot reduce ``dtype``."""
        check_dtype(dtype)
        if dtype not in self.dtypes:
            raise UnsupportedOpError(
                f"op {self.name!r} does not apply to {dtype}; it takes {', '.join(self.dtypes)}"
            )


OPS: dict[str, ReduceOp] = {
    op.name: op
    for op in (
        ReduceOp("sum", "sum", DTYPES),
        ReduceOp("prod", "prod", DTYPES),
        ReduceOp("min", "min", DTYPES),
        ReduceOp("max", "max", DTYPES),
        ReduceOp("avg", "sum", FLOAT_DTYPES),
        ReduceOp("band", "band", INTEGER_DTYPES),
        ReduceOp("bor", "bor", INTEGER_DTYPES),
        ReduceOp("bxor", "bxor", INTEGER_DTYPES),
    )
}


def get_op(op: "str | ReduceOp") -> ReduceOp:
    """Look up an op by name; the error lists the valid names."""
    if isinstance(op, ReduceOp):
        return op
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise UnsupportedOpError(f"unknown op {op!r}; valid ops are {', '.join(OPS)}") from None


def check_dtype(dtype: str) -> None:
    """Raise if ``dtype`` (a dtype name) is not one the library moves and reduces."""
    if dtype not in DTYPES:
        raise UnsupportedDtypeError(f"unsupported dtype {dtype}; supported dtypes are {', '.join(DTYPES)}")


def itemsize(dtype: object) -> int:
    """Bytes per element of a dtype, by name (``"float32"``) or as a numpy-like dtype with a ``name``."""
    name = str(getattr(dtype, "name", dtype))
    check_dtype(name)
    # every supported dtype's name ends in its width in bits
    return int(name.lstrip("abcdefghijklmnopqrstuvwxyz")) // 8
