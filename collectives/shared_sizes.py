"""The shared-memory executor's sizes, each measured: one-barrier windows, segments, crowded nodes.

What :mod:`collectives.execute_shared` runs each call by (and the cost model counts), kept apart
from it with the measurements that chose them.
"""

__all__ = [
    "COMPILED_SMALL_READ_BYTES",
    "OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES",
    "OVERSUBSCRIBED_SEGMENT_BYTES",
    "SEGMENT_BYTES",
    "SMALL_TOTAL_BYTES",
    "WHOLE_SMALL_TOTAL_BYTES",
    "oversubscribed",
    "scatter_small_bytes",
    "small_bytes",
]

import os

SMALL_TOTAL_BYTES = 1 << 19
"""Allreduces whose inputs on all ranks together are at most this size take one barrier.

Every rank copies its input in and reduces the whole buffer itself, reading P
regions, rather than one share of it (a barrier more and the shares copied out).
Measured on 2 cores (2 MiB L2): at 2 ranks the one barrier won up to 128 KiB, tied
at 256 KiB and lost at 512 KiB (63 against 76 us); at 4 ranks it won up to 64 KiB
(61 against 102 us), tied at 128 KiB and lost at 256 KiB.
"""

COMPILED_SMALL_READ_BYTES = 1 << 21
"""Where the compiled engine runs (:mod:`collectives.engine`), an allreduce passes one barrier while the
bytes its ranks read in all, each every rank's input (``P * P`` times one input), are at most this.

What one barrier costs past a few hundred KiB is the bytes each rank reads, ``P`` inputs against a
segmented call's two shares, and where they come from. Measured on 2 cores (2 MiB L2) against
segments, float32 sum in place, Intel MPI beside in one launch: at 2 ranks and 1 MiB a rank, one
barrier took 37-50 us where the machine was fast (segments 55-70, Intel 49-73) but 115-162 us in
launches where it was slow (segments 66-70, Intel 60-68), so 1 MiB goes in segments, which hold
their time; at 4 ranks one barrier at 256 KiB took 1.08-1.31x Intel's time. So 512 KiB a rank at
2 ranks, 128 KiB at 4, 32 KiB at 8. The ranks agree whether the engine runs
(:mod:`collectives.settings_agreement`), so they agree on the path; the communicator passes it.
"""


def small_bytes(size: int, compiled: bool) -> int:
    """Each rank's input bytes up to which an allreduce of ``size`` ranks passes one barrier.

    :data:`SMALL_TOTAL_BYTES` in all on the Python path; :data:`COMPILED_SMALL_READ_BYTES` read
    in all where the compiled engine runs.
    """
    if compiled:
        return COMPILED_SMALL_READ_BYTES // (size * size)
    return SMALL_TOTAL_BYTES // size


def scatter_small_bytes(size: int, compiled: bool) -> int:
    """Each rank's input bytes up to which a reduce-scatter of ``size`` ranks passes one barrier.

    Its ranks read a share of every rank's input, not all of it, so where the compiled engine runs
    ``size`` times an allreduce's window (:func:`small_bytes`). Measured at 4 ranks on 2 cores,
    calls back to back: 256 KiB a rank 28-42 us against 100-147 in one segment of the Python path,
    512 KiB 45-72 against 108-115 (Intel MPI 42-69 and 58-92 in the same launches); at 2 ranks 1 MiB
    alike (53-58 against 54-55). The Python path keeps the allreduce's: at 4 ranks one barrier there
    lost at 512 KiB (131 against 106 us).
    """
    return small_bytes(size, compiled) * (size if compiled else 1)


WHOLE_SMALL_TOTAL_BYTES = 1 << 17
""":data:`SMALL_TOTAL_BYTES` for an op that combines every rank's part at once (the reproducible sum's)
at more than two ranks: past it each owner combines its share of all parts instead of every rank all.

Measured at 4 ranks on 2 cores (``bench reproducible``, ratio to the default allreduce in one launch):
with one barrier up to 1 MiB in all, 64 KiB took 2.13x, 128 KiB 2.18x, 256 KiB 2.11x; past 128 KiB in
all, 1.59x, 1.42x and 1.22x; past 32 KiB, 16 KiB lost (2.18x against 1.85x).
"""

SEGMENT_BYTES = 1 << 19
"""Bytes of each rank's share that one segment takes through the window (measured, see the module).

Measured again at 2 ranks on 2 cores with a 480 MiB L3 (allreduce in place, the sizes
alternating in one launch, medians): 512 KiB against 256 KiB took 65-73 against 72-76 us
at 1 MiB, 249-265 against 276-289 us at 4 MiB, 1.26-2.34 against 1.27-2.50 ms at 16 MiB and
5.38-5.41 against 5.87-5.91 ms at 64 MiB; 128 KiB and 2 MiB lost at every size.
"""

OVERSUBSCRIBED_SEGMENT_BYTES = 1 << 18
"""The same where a node's ranks outnumber its cores, so that a barrier may wait for a rank to be scheduled.

At 4 ranks on 2 cores (in place, back to back, side by side): 256 KiB against 1 MiB took 529-631
against 1146-1161 us at 4 MiB, 3.0-3.2 against 5.6-5.7 ms at 16 MiB (engine off: 970-979 against
1191-1248 us at 4 MiB); 128 and 512 KiB alike or between, 64 KiB and 2 MiB slower.
"""

OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES = 1 << 20
"""A broadcast's or reduce's segment of its whole buffer where a node's ranks outnumber its cores.

A quarter of an allreduce's segments would pass four times the barriers for one buffer: at 4 ranks
on 2 cores a 16 MiB broadcast took 2.2-2.5 ms in segments of 256 KiB against 1.7-1.8 in 1 MiB.
"""


def oversubscribed(node_ranks: int) -> bool:
    """Whether ``node_ranks`` ranks on one machine outnumber its cores; the same on every rank of it."""
    return node_ranks > (os.cpu_count() or 1)
