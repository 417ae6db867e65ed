"""The executor's plans: scratch kept between calls, and segments that never change the bits."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives.algorithms import ALGORITHMS, build_schedule
from collectives.backends import backend_for
from collectives.execute import execute
from collectives.ops import get_op

Ranks = Callable[..., list[Any]]


def test_scratch_is_kept_between_calls_of_one_size(ranks: Ranks) -> None:
    def run(comm: C.Communicator) -> bool:
        x = np.arange(1000, dtype=np.float32)
        C.allreduce(x, algorithm="ring", comm=comm)
        kept = dict(comm.scratch._buffers)
        for _ in range(20):
            C.allreduce(x, algorithm="ring", comm=comm)
        return all(comm.scratch._buffers[key] is buffer for key, buffer in kept.items()) and bool(kept)

    assert all(ranks(3, run))


@pytest.mark.parametrize("algorithm", [n for n, m in ALGORITHMS.items() if hasattr(m, "allreduce")])
def test_any_segment_size_gives_the_same_bits(ranks: Ranks, algorithm: str) -> None:
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(1003).astype(np.float32) for _ in range(4)]

    def run(comm: C.Communicator, segment: int, separate: bool) -> np.ndarray:
        schedule = build_schedule("allreduce", algorithm, 4, 1003)
        x = inputs[comm.rank]
        work = np.empty_like(x) if separate else x.copy()
        source = x if separate else None
        execute(
            schedule,
            comm.transport,
            backend_for(x),
            work,
            get_op("sum"),
            source=source,
            segment_bytes=segment,
        )
        return work

    reference = ranks(4, lambda comm: run(comm, 0, False))
    for segment in (4, 12, 1024, 1 << 18):
        for separate in (False, True):
            got = ranks(4, lambda comm, s=segment, d=separate: run(comm, s, d))
            assert all(
                np.array_equal(a.view(np.uint32), b.view(np.uint32))
                for a, b in zip(got, reference, strict=True)
            )
    assert all(np.array_equal(r.view(np.uint32), reference[0].view(np.uint32)) for r in reference)
