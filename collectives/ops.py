"""Reduction ops and the dtypes they apply to."""

__all__ = [
    "DTYPES",
    "FLOAT_DTYPES",
    "INTEGER_DTYPES",
    "OPS",
    "Op",
    "ReduceOp",
    "check_dtype",
    "get_op",
    "itemsize",
]

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import UnsupportedDtypeError, UnsupportedOpError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INTEGER_DTYPES = (
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
)  # fmt: skip
DTYPES = FLOAT_DTYPES + INTEGER_DTYPES


@dataclass(frozen=True)
class ReduceOp:
    """A built-in element-wise reduction, associative and commutative; :class:`Op` makes the user's.

    Attributes:
        name: the name users pass (``"sum"``, ``"max"``, ...).
        combine: the binary op applied when two contributions meet; ``avg``
            combines with ``sum`` and divides by the world size once at the end.
        dtypes: the dtype names the op is defined for.
    """

    name: str
    combine: str
    dtypes: tuple[str, ...]

    custom: ClassVar[bool] = False
    """Whether the op is the user's (an :class:`Op`), applied by calling its function."""

    whole: ClassVar[bool] = False
    """Whether the op combines every rank's contribution to an element at once (:meth:`apply_all`), not
    two at a time: where there are more than two, only the shared-memory executor, whose owners read
    all of them together, runs it."""

    @property
    def commutative(self) -> bool:
        """Whether the order of the ranks' contributions does not matter; every built-in op's does not."""
        return True

    @property
    def averages(self) -> bool:
        """Whether the result is divided by the world size after combining."""
        return self.name == "avg"

    @property
    def compiled_combine(self) -> str | None:
        """The compiled engine's name of the combine (:func:`collectives.engine.reduces` says for which
        dtypes it applies it), or ``None`` where the op's own function must run: a custom op's."""
        return None if self.custom else self.combine

    @property
    def agreed_name(self) -> str:
        """What the ranks compare before a call (at most 8 bytes of the signature)."""
        return self.name

    def apply(self, dst: Any, a: Any, b: Any) -> None:
        """``dst = a op b``, for a custom op; the backends apply built-in ops with their own kernels."""
        raise UnsupportedOpError(f"op {self.name!r} is built in: a backend applies it")

    def apply_all(self, dst: Any, parts: Any) -> None:
        """``dst`` = every rank's ``parts`` combined at once, in rank order (an op that is :attr:`whole`)."""
        raise UnsupportedOpError(f"op {self.name!r} combines two contributions at a time")

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


class Op(ReduceOp):
    """A reduction of the user's: a numpy ufunc or a function of two arrays, combined element-wise.

    ``combine(a, b)`` takes two 1-D arrays of one dtype and returns (or, a
    ufunc, writes to ``out=``) their element-wise combination. It must be
    associative, and each element must stand alone: the collectives split
    buffers anywhere and combine partial results in an order the algorithm
    chooses. A *commutative* op (``combine(a, b) == combine(b, a)``) runs on
    every algorithm; a non-commutative one gets ``x0 op x1 op ... op x(P-1)``
    in rank order, and only on the algorithms that keep that order
    (``algorithm="auto"`` picks among them; another raises
    :class:`~collectives.UnsupportedOpError` naming them).

    The ranks agree on the op by its name before each call, so every rank must
    build it alike: a ufunc is named by itself (``"logaddexp"``), a function by
    its module, qualified name and line. A rank passing another op raises
    :class:`~collectives.MismatchError` on every rank. Custom ops run on numpy
    arrays only (the device backends reduce with their own kernels).

    Args:
        combine: a numpy ufunc of two inputs (``np.maximum``, ``np.logaddexp``),
            or a function ``f(a, b) -> array`` of two arrays.
        identity: the op's neutral element (``-inf`` for max and logaddexp),
            where it has one; for the user's reference, the collectives never need it.
        commutative: whether ``combine(a, b) == combine(b, a)``.
        name: the name the ranks agree on; by default the ufunc's or function's.
        dtypes: the dtype names it applies to; every supported dtype by default,
            each checked by a trial on its first use.

    Example:
        >>> import numpy as np
        >>> logsumexp = Op(np.logaddexp, identity=-np.inf)
        >>> logsumexp.name
        'logaddexp'
    """

    custom: ClassVar[bool] = True

    function: Callable[..., Any]
    identity: Any
    checked: set[str]  # the dtypes a trial showed it applies to (see collectives.buffers)

    def __init__(
        self,
        combine: Callable[..., Any],
        identity: Any = None,
        *,
        commutative: bool = True,
        name: str | None = None,
        dtypes: "tuple[str, ...] | list[str] | None" = None,
    ) -> None:
        if not callable(combine):
            raise UnsupportedOpError(f"Op needs a function of two arrays or a numpy ufunc, got {combine!r}")
        label = _name_of(combine) if name is None else name
        if not isinstance(label, str) or not label:
            raise UnsupportedOpError(f"an op's name must be a non-empty string, got {label!r}")
        if label in OPS:
            raise UnsupportedOpError(f"{label!r} is a built-in op's name; give the custom op another name=")
        kinds = DTYPES if dtypes is None else tuple(dtypes)
        for dtype in kinds:
            check_dtype(dtype)
        inputs = getattr(combine, "nin", 2) if _is_ufunc(combine) else 2
        if inputs != 2:
            raise UnsupportedOpError(f"ufunc {label!r} takes {inputs} inputs; an op combines two")
        code = getattr(combine, "__code__", None)  # two lambdas of one line differ in their code
        text = f"{label}|{bool(commutative)}|{identity!r}".encode() + (b"" if code is None else code.co_code)
        digest = hashlib.blake2b(text, digest_size=2).hexdigest()
        short = "".join(c for c in label.split(".")[-1] if c.isascii() and (c.isalnum() or c == "_"))[:3]
        fields = {"name": label, "combine": f"{short}~{digest}", "dtypes": kinds, "function": combine}
        fields |= {"identity": identity, "_commutative": bool(commutative), "checked": set()}
        fields["_ufunc"] = _is_ufunc(combine)
        for field, value in fields.items():
            object.__setattr__(self, field, value)

    @property
    def commutative(self) -> bool:
        return bool(self._commutative)  # type: ignore[attr-defined]

    @property
    def averages(self) -> bool:
        return False

    @property
    def agreed_name(self) -> str:
        """The op's name cut to 3 characters and a hash of its name, commutativity and identity."""
        return self.combine

    def apply(self, dst: Any, a: Any, b: Any) -> None:
        if self._ufunc:  # type: ignore[attr-defined]
            self.function(a, b, out=dst)
        else:
            dst[...] = self.function(a, b)

    # one op is the same op however often it is passed: by identity, as functions compare
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        order = "commutative" if self.commutative else "non-commutative"
        return f"Op({self.name!r}, identity={self.identity!r}, {order})"


def _is_ufunc(function: object) -> bool:
    """Whether ``function`` is a numpy ufunc, told without importing numpy."""
    return type(function).__name__ == "ufunc" and hasattr(function, "nin")


def _name_of(function: Callable[..., Any]) -> str:
    """A name every rank gives the same function: a ufunc's own, else module, qualified name and line."""
    if _is_ufunc(function):
        return str(function.__name__)
    qualified = getattr(function, "__qualname__", None)
    if qualified is None:
        raise UnsupportedOpError(f"{function!r} has no name the ranks could agree on; pass name=")
    name = f"{getattr(function, '__module__', None) or ''}.{qualified}".lstrip(".")
    code = getattr(function, "__code__", None)
    if "<" in qualified and code is not None:  # a lambda or a nested function: its line tells it apart
        name += f":{code.co_firstlineno}"
    return name


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
