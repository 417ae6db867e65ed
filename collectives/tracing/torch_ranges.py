"""The torch faces' calls as ``torch.profiler`` ranges, where the profiler records or tracing is on.

The collectives torch.distributed backend and the Horovod API run their calls on
a communication thread; :func:`ranged` puts such a job in a ``record_function``
range named after the call, its parameters (tensors' shapes and dtypes, or the
Horovod name) in the range's ``args``, so that a ``torch.profiler`` trace shows
the communication beside the model's work. Otherwise the job is returned as it
is: the test costs an attribute read.
"""

__all__ = ["profiling", "ranged", "tensors_text"]

import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .recorder import TRACER

T = TypeVar("T")


def profiling() -> bool:
    """Whether ``torch.profiler`` (or the autograd profiler) is recording in this process."""
    profiler = sys.modules.get("torch.autograd.profiler")
    return bool(profiler is not None and getattr(profiler, "_is_profiler_enabled", False))


def tensors_text(tensors: Any) -> str:
    """``float32[1024], float32[8]``: the shapes and dtypes of the tensors (nested lists flattened)."""
    flat: list[Any] = []

    def walk(item: Any) -> None:
        if isinstance(item, list | tuple):
            for inner in item:
                walk(inner)
        elif hasattr(item, "shape") and hasattr(item, "dtype"):
            flat.append(item)

    walk(tensors)
    shown = [f"{str(t.dtype).removeprefix('torch.')}[{'x'.join(map(str, t.shape))}]" for t in flat[:8]]
    return ", ".join(shown) + (f" (+{len(flat) - 8} more)" if len(flat) > 8 else "")


def ranged(name: str, describe: Callable[[], str], job: Callable[[], T]) -> Callable[[], T]:
    """``job``, inside a ``record_function`` range ``name`` (``describe()`` its args) where recorded.

    The range opens here, on the calling thread (the profiler records that
    thread's ranges only), and closes when ``job`` has run on the communication
    thread: it spans the call from its submission to its completion.
    """
    if not (TRACER.on or profiling()):
        return job
    import torch
    from torch.profiler import record_function

    span = record_function(name, describe())
    span.__enter__()  # type: ignore[no-untyped-call]  # torch leaves it untyped
    done: torch.futures.Future[None] = torch.futures.Future()
    span._call_end_callbacks_on_future(done)  # torch's way to end a range on another thread

    def run() -> T:
        try:
            return job()
        finally:
            done.set_result(None)

    return run
