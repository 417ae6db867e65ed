"""What the cost model says a traced call should have taken, step by step, for ``trace merge --predict``.

The call's total is the selector's prediction for its algorithm, the figure
``collectives.explain`` prints (the calibration's model for the world size,
its measured corrections included). Its steps are the closed model's terms of
each step of the algorithm's schedule (``step + alpha m + beta b + gamma r``,
:class:`~collectives.topology.cost_model.CostModel`), scaled so that with the
call's ``overhead`` they add up to that total (the scale is stated; 1 where
the model has no correction for the algorithm).
"""

__all__ = ["Predicted", "predict_call"]

from dataclasses import dataclass
from functools import lru_cache

from ..algorithms import ALGORITHMS, build_schedule
from ..algorithms.base import required_feature
from ..errors import CollectivesError
from ..ops import itemsize
from ..schedule import Schedule
from ..selector import default_selector
from ..topology.cost_model import traffic


@dataclass(frozen=True)
class Predicted:
    """A call's predicted time and its steps' (seconds), or why there is none.

    Attributes:
        total: the selector's prediction for the call (what ``explain`` prints); 0 with ``why``.
        overhead: the model's per-call seconds, before the first step.
        steps: seconds of each step of the schedule, in order.
        scale: what the steps' closed-model terms were multiplied by to add up to ``total``.
        schedule: the schedule's name.
        why: why nothing was predicted (the algorithm cannot run the call, say); empty otherwise.
    """

    total: float
    overhead: float = 0.0
    steps: tuple[float, ...] = ()
    scale: float = 1.0
    schedule: str = ""
    why: str = ""


@lru_cache(maxsize=4096)
def predict_call(
    collective: str, algorithm: str, world_size: int, count: int, dtype: str, op: str, root: int = 0
) -> Predicted:
    """The model's time for ``algorithm``'s ``collective`` of ``count`` ``dtype`` on ``world_size`` ranks."""
    module = ALGORITHMS.get(algorithm)
    if module is None:
        return Predicted(0.0, why=f"no algorithm {algorithm!r}")
    selector = default_selector(world_size)
    needs = required_feature(module)
    features = frozenset() if needs is None else frozenset({needs})
    try:
        explanation = selector.explain(
            collective, count, dtype or "uint8", world_size=world_size, op=op or "sum", features=features
        )
    except (CollectivesError, ValueError, TypeError, KeyError) as error:
        return Predicted(0.0, why=f"not predicted: {error}")
    candidate = next((c for c in explanation.candidates if c.algorithm == algorithm), None)
    if candidate is None:
        reasons = next((r.reasons for r in explanation.rejected if r.algorithm == algorithm), ())
        return Predicted(0.0, why=f"{algorithm} not a candidate: {'; '.join(reasons) or 'unknown'}")
    model = selector.model
    size = itemsize(dtype) if dtype else 1
    try:
        schedule = build_schedule(collective, algorithm, world_size, count, root=root)
    except (CollectivesError, ValueError) as error:
        return Predicted(candidate.time, model.overhead, why=f"no schedule: {error}")
    terms = [
        sum(model.terms(traffic(_one_step(schedule, i)), size, world_size))
        for i in range(len(schedule.steps))
    ]
    # each step's terms include the call's overhead once: leave it out of the steps
    steps = [max(t - model.overhead, 0.0) for t in terms]
    body = candidate.time - model.overhead
    # a body of nothing (the shared-memory barrier: the call's own barrier is all of it) scales steps to 0
    scale = body / sum(steps) if sum(steps) > 0 and body >= 0 else 1.0
    return Predicted(
        candidate.time, model.overhead, tuple(s * scale for s in steps), round(scale, 4), candidate.schedule
    )


def _one_step(schedule: Schedule, index: int) -> Schedule:
    """``schedule`` with only its step ``index``, for counting that step's traffic."""
    return Schedule(
        schedule.name,
        schedule.collective,
        schedule.world_size,
        schedule.chunk_sizes,
        (schedule.steps[index],),
        schedule.chunk_owner,
        schedule.root,
    )
