"""What ``reproducible=True`` costs a call: the route it takes, its steps and the cost model's prediction.

The route is the one :mod:`collectives.reproducible_calls` takes for the call: at
two ranks (float32 or float64, checked calls, the compiled engine running) the
plain call with the reproducible sum of two contributions as its op; at 3 to 64
ranks that share one node's memory, the plain call on shared memory with the op
that sums every rank's contribution at once; a small allreduce's contributions
gathered by one bitwise-or allreduce and summed on each rank; elsewhere the codes
agreed by an int8 max-allreduce, the words summed by the collective, and one
rounding back. Each collective is predicted as
``explain`` predicts the plain call (the selector's choice for its count, dtype
and op); the conversion's passes, which the cost model does not count, as
multiples of its ``gamma`` (seconds per byte reduced), measured against a numpy
sum of the same elements (:data:`PASSES`).
"""

__all__ = ["PASSES", "reproducible_cost"]

from .explanation import Explanation, ReproducibleCost, ReproducibleStep
from .ops import INTEGER_DTYPES, itemsize
from .reproducible import EXACT_IN_FLOAT64, family_of, kernels
from .reproducible_calls import SHARED_MEMORY, gathers, pair_op
from .selector import Selector
from .topology import Topology

PASSES = {"codes": 1.0, "words": 1.5, "finish": 1.0, "row": 1.2}
"""Each conversion pass's time over a reduction of the same elements' bytes (the cost model's
``gamma``): the codes, the cut into words, the rounding back, and per rank's row the
reproducible sum of raw rows (gathered, or the op's: compiled loops, float32, 0.1 to 0.2 ns an
element a row on a 2-core AMD EPYC, where a numpy sum of two rows takes 0.16)."""


def reproducible_cost(
    selector: Selector,
    plain: Explanation,
    *,
    features: frozenset[str],
    topology: Topology | None,
    checked: bool,
) -> ReproducibleCost:
    """The cost of ``plain``'s call (an :class:`Explanation`) with ``reproducible=True``.

    Args:
        selector: the selector that explained ``plain``, which predicts each step's collective.
        plain: the plain call's explanation: its collective, count, dtype, world size and op.
        features: what the transport offers, as for the plain call.
        topology: the machine to predict on, as for the plain call.
        checked: whether the ranks agree on each call first (the gathered sum and the
            two ranks' op need it).

    Raises:
        ValueError: for a collective other than allreduce and reduce_scatter.
        UnsupportedOpError: for an op other than sum and avg.
    """
    from .errors import UnsupportedOpError

    collective, count, name, size, op = plain.collective, plain.count, plain.dtype, plain.world_size, plain.op
    if collective not in ("allreduce", "reduce_scatter"):
        raise ValueError(f"reproducible=True applies to allreduce and reduce_scatter, not {collective}")
    chosen = next((c for c in plain.candidates if c.algorithm == plain.choice), None)
    plain_time = chosen.time if chosen is not None else 0.0
    if name in INTEGER_DTYPES:
        return ReproducibleCost("integer sums are exact: the plain call itself", (), plain_time)
    if op not in ("sum", "avg"):
        raise UnsupportedOpError(f"reproducible=True sums: op must be 'sum' or 'avg', not {op!r}")
    family = family_of(name)
    gamma = selector.model.gamma

    def step(name_: str, collective_: str, count_: int, dtype: str, op_: str) -> ReproducibleStep:
        explained = selector.explain(
            collective_, count_, dtype, world_size=size, op=op_, features=features, topology=topology
        )
        best = next((c for c in explained.candidates if c.algorithm == explained.choice), None)
        work = f"{collective_} of {count_} {dtype}, op {op_}"
        seconds = 0.0 if best is None else best.time
        return ReproducibleStep(name_, work, explained.choice, count_ * itemsize(dtype), seconds)

    def local(step_name: str, work: str, nbytes: int, passes: float) -> ReproducibleStep:
        return ReproducibleStep(step_name, work, None, nbytes, passes * gamma * nbytes)

    nbytes = count * family.work.itemsize
    steps: tuple[ReproducibleStep, ...]
    if size == 1:
        steps = (
            local("codes", "each element's exponent code", nbytes, PASSES["codes"]),
            local("cut into words", "the contribution cut at its code", nbytes, PASSES["words"]),
            local("rounded back", "the words rounded once to the dtype", nbytes, PASSES["finish"]),
        )
        return ReproducibleCost("one rank: converted and rounded back, no communication", steps, plain_time)
    if pair_op(size, name, op, checked) is not None and chosen is not None:
        route = (
            "the plain call, its op the reproducible sum of the two ranks' raw contributions (two ranks: "
            "every algorithm combines an element's two contributions once); the plain call's bytes"
        )
        heavier = (2 * PASSES["row"] - 1) * chosen.reduction  # the op's two rows against a sum's one pass
        reduction = ReproducibleStep(
            "summed by the op", f"{collective} of {count} {name}, op {op} of two contributions",
            plain.choice, count * itemsize(name), chosen.time + heavier,
        )  # fmt: skip
        return ReproducibleCost(route, (reduction,), plain_time)
    shared = next((c for c in plain.candidates if c.algorithm == SHARED_MEMORY), None)
    summed_at_once = checked and name in ("float32", "float64") and kernels() is not None
    if shared is not None and summed_at_once and 2 < size <= EXACT_IN_FLOAT64:
        route = (
            "on shared memory: the plain call by shared_memory, its op the reproducible sum of every "
            "rank's raw contribution at once (each owner sums its share of all ranks' inputs); the plain "
            "call's bytes"
        )
        heavier = (size * PASSES["row"] - 1) * shared.reduction  # the op's rows against a sum's one pass
        reduction = ReproducibleStep(
            "summed by the op", f"{collective} of {count} {name}, op {op} of every rank's contribution",
            SHARED_MEMORY, count * itemsize(name), shared.time + heavier,
        )  # fmt: skip
        return ReproducibleCost(route, (reduction,), plain_time)
    if collective == "allreduce" and gathers(size, count, family.work.itemsize, checked):
        words = "int32" if family.words == 1 else "int64"
        route = (
            f"gathered: one bitwise-or allreduce of every rank's raw contribution ({size} rows of "
            f"{size * (count + 2) * family.work.itemsize} bytes in all), summed on each rank"
        )
        steps = (
            step("contributions gathered", "allreduce", size * (count + 2), words, "bor"),
            local("rows summed here", f"{size} rows: codes, cut, summed, rounded once", size * nbytes,
                  PASSES["row"]),
        )
        return ReproducibleCost(route, steps, plain_time)
    exact = family.words == 1 and size <= EXACT_IN_FLOAT64
    wire, per = ("float64", 1) if exact else ("int64", family.words)
    route = (
        f"two collectives: the exponent codes agreed (int8 max), then the contributions cut into "
        f"{per * 8} bytes an element ({wire}) summed exactly by {collective}; one rounding back"
    )
    steps = (
        local("codes", "each element's exponent code", nbytes, PASSES["codes"]),
        step("codes agreed", "allreduce", count + 5, "int8", "max"),
        local("cut into words", f"the contribution cut at the agreed codes, {wire}", nbytes, PASSES["words"]),
        step("words summed", collective, count * per, wire, "sum"),
        local("rounded back", "the summed words rounded once to the dtype", nbytes, PASSES["finish"]),
    )
    note = "an inf or a NaN in the inputs adds a bitwise-or allreduce of one byte an element"
    return ReproducibleCost(route, steps, plain_time, note)
