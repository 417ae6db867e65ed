"""``bench kernels``: bandwidth of the CUDA reduction kernels against a copy, CuPy and torch.

Every contender runs on buffers of ``size`` bytes on one GPU, timed with CUDA events
around each call (after warmup calls), and the median is reported. Each timed call is queued
behind a kernel that holds the stream for a millisecond, so the events measure the GPU's work
and not Python's launch overhead (which bounds small sizes in real use). Bandwidth counts the
bytes the call reads plus the bytes it writes: a copy moves 2 buffers, a two-input
reduction 3, ``reduce_many`` of 8 inputs 9. The 8-input ``reduce_many`` is also set
against the seven two-input ``combine`` calls it replaces; "of copy" compares each
bandwidth with the device-to-device copy's at that size, the ceiling of a streaming kernel.

Needs CuPy and a CUDA device (and torch built with CUDA for its row); without them it
exits with status 2 and one line saying what is missing.
"""

__all__ = ["Measurement", "bytes_moved", "format_table", "main", "to_json"]

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collectives.ops import OPS, get_op

from .config import add_datatype, add_sweep, size_sweep
from .table import Column, Table, human_bytes

INPUTS = 8
"""Inputs of the ``reduce_many`` row, and one more than the number of combines it is set against."""

# buffers each contender reads plus writes, in units of the size
_BUFFERS = {
    "copy": 2,
    "combine": 3,
    "reduce_into": 3,
    "divide": 2,
    f"reduce_many({INPUTS})": INPUTS + 1,
    f"{INPUTS - 1}x combine": 3 * (INPUTS - 1),
}
_CUPY_UFUNCS = {
    "sum": "add",
    "prod": "multiply",
    "min": "minimum",
    "max": "maximum",
    "band": "bitwise_and",
    "bor": "bitwise_or",
    "bxor": "bitwise_xor",
}
# torch's in-place method, or its out= function, per op
_TORCH_OPS = {
    "sum": "add_",
    "prod": "mul_",
    "min": "minimum",
    "max": "maximum",
    "band": "bitwise_and_",
    "bor": "bitwise_or_",
    "bxor": "bitwise_xor_",
}
_COLUMNS = (
    Column("size", width=10),
    Column("kernel", width=18, left=True),
    Column("time(us)", ".1f", width=11),
    Column("GB/s", ".1f", width=9),
    Column("of copy", ".2f", width=8),
)


@dataclass(frozen=True)
class Measurement:
    """The timings of one contender at one size.

    Attributes:
        size: bytes of one buffer.
        kernel: the contender's name (``combine``, ``cupy.add``, ``torch.add_``, ``copy``, ...).
        buffers: buffers of ``size`` bytes it reads plus writes per call.
        times_ms: each timed call's milliseconds, as CUDA events measured them.
    """

    size: int
    kernel: str
    buffers: int
    times_ms: tuple[float, ...]

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_ms) * 1e3

    @property
    def gbps(self) -> float:
        """Bytes read plus written per second, in GB/s (1e9 bytes per second)."""
        return self.buffers * self.size / (self.median_us * 1e-6) / 1e9


def bytes_moved(kernel: str, size: int) -> int:
    """Bytes ``kernel`` reads plus writes on buffers of ``size`` bytes; a library's op counts as combine."""
    return _BUFFERS.get(kernel, _BUFFERS["combine"]) * size


def format_table(measurements: Sequence[Measurement]) -> list[str]:
    """The table's lines: a header, a row per measurement, and per size the reduce_many speedup."""
    table = Table(_COLUMNS)
    lines = [table.header()]
    copies = {m.size: m.gbps for m in measurements if m.kernel == "copy"}
    by_size: dict[int, dict[str, Measurement]] = {}
    for m in measurements:
        by_size.setdefault(m.size, {})[m.kernel] = m
        of_copy = m.gbps / copies[m.size] if m.size in copies else None
        lines.append(table.row(human_bytes(m.size), m.kernel, m.median_us, m.gbps, of_copy))
    for size, row in by_size.items():
        many, combines = row.get(f"reduce_many({INPUTS})"), row.get(f"{INPUTS - 1}x combine")
        if many is not None and combines is not None:
            lines.append(
                f"# {human_bytes(size)}: reduce_many({INPUTS}) {many.median_us:.1f} us, "
                f"{INPUTS - 1} combines {combines.median_us:.1f} us: "
                f"speedup {combines.median_us / many.median_us:.2f}x"
            )
    return lines


def to_json(measurements: Sequence[Measurement], metadata: dict[str, Any]) -> dict[str, Any]:
    """The run as a JSON-ready record: its metadata and every measurement with its median and bandwidth."""
    return {
        **metadata,
        "rows": [
            {
                "size": m.size,
                "kernel": m.kernel,
                "bytes_moved": m.buffers * m.size,
                "median_us": m.median_us,
                "gbps": m.gbps,
                "times_ms": list(m.times_ms),
            }
            for m in measurements
        ],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench kernels",
        description="GB/s of the CUDA reduction kernels against a device copy, CuPy and torch, on one GPU.",
    )
    add_sweep(parser, "1M", "1G", what="buffer")
    add_datatype(parser)
    add = parser.add_argument
    add("-o", "--op", choices=[name for name in OPS if name != "avg"], default="sum", help="default sum")
    add("-n", "--iters", type=int, default=20, help="timed calls per contender and size (default 20)")
    add("-w", "--warmup", type=int, default=5, help="untimed calls first (default 5)")
    add("--json", type=Path, metavar="PATH", help="also save every timing, with metadata, as JSON")
    return parser


def _device() -> tuple[Any, str]:
    """CuPy and the current device's name; raises RuntimeError naming what is missing."""
    try:
        import cupy
    except ImportError as error:
        raise RuntimeError(f"needs CuPy (pip install cupy-cuda13x): {error}") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("needs a CUDA device; CuPy sees none")
        properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise RuntimeError(f"needs a CUDA device: {error}") from None
    name = properties["name"]
    return cupy, name.decode() if isinstance(name, bytes) else str(name)


def _torch(cupy: Any) -> Any:
    """torch if it has CUDA, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# one thread that holds the stream for a while, so the CPU queues the timed call behind it and
# the events time the GPU's work alone, not Python's launch overhead (as nvbench's blocking kernel)
_WAIT_SOURCE = r"""
extern "C" __global__ void collectives_bench_wait(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
"""
_WAIT_NS = 1_000_000  # far longer than queuing any contender's launches takes


def _time(cupy: Any, call: Callable[[], object], iters: int, warmup: int) -> tuple[float, ...]:
    """Milliseconds of each of ``iters`` calls by CUDA events on the current stream, after ``warmup``."""
    for _ in range(warmup):
        call()
    wait = cupy.RawKernel(_WAIT_SOURCE, "collectives_bench_wait")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(iters):
        wait((1,), (1,), (np.uint64(_WAIT_NS),))
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(float(cupy.cuda.get_elapsed_time(start, end)))
    return tuple(times)


def _contenders(
    cupy: Any, torch: Any, op: str, dtype: str, buffers: list[Any], notes: list[str]
) -> dict[str, Callable[[], object]]:
    """The calls to time on ``buffers`` (dst and INPUTS sources), by name."""
    from collectives.backends import gpu_kernels

    dst, a, b = buffers[0], buffers[1], buffers[2]
    sources = buffers[1:]
    override = {"dtype": dtype}
    calls: dict[str, Callable[[], object]] = {
        "copy": lambda: dst.data.copy_from_device_async(a.data, a.nbytes),
        "combine": lambda: gpu_kernels.combine(op, a, b, **override),
        "reduce_into": lambda: gpu_kernels.reduce_into(op, dst, a, b, **override),
    }
    if dtype in get_op("avg").dtypes:
        calls["divide"] = lambda: gpu_kernels.divide(a, INPUTS, **override)
    calls[f"reduce_many({INPUTS})"] = lambda: gpu_kernels.reduce_many(op, dst, sources, **override)

    def combines() -> None:
        for source in sources[1:]:
            gpu_kernels.combine(op, sources[0], source, **override)

    calls[f"{INPUTS - 1}x combine"] = combines
    ufunc = _CUPY_UFUNCS[op]
    if dtype == "bfloat16":
        notes.append("cupy skipped: CuPy has no bfloat16")
    else:
        function = getattr(cupy, ufunc)
        calls[f"cupy.{ufunc}"] = lambda: function(a, b, out=a)
    if torch is None:
        notes.append("torch skipped: no torch with CUDA")
    else:
        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        if dtype == "bfloat16":
            ta, tb = ta.view(torch.bfloat16), tb.view(torch.bfloat16)
        method = _TORCH_OPS[op]
        if method.endswith("_"):
            torch_call: Callable[[], object] = lambda: getattr(ta, method)(tb)  # noqa: E731
        else:
            torch_call = lambda: getattr(torch, method)(ta, tb, out=ta)  # noqa: E731
        try:
            torch_call()
        except (RuntimeError, TypeError) as error:  # e.g. an op torch lacks for the unsigned dtypes on CUDA
            notes.append(f"torch skipped: {str(error).splitlines()[0]}")
        else:
            calls[f"torch.{method}"] = torch_call
    return calls


def main(argv: list[str]) -> int:
    """Run the sweep and print the table; 2 (with one line on stderr) without CuPy or a device."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"need -n of at least 1 and -w of at least 0; got -n {args.iters} -w {args.warmup}")
    try:
        sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        get_op(args.op).check_dtype(args.datatype)
    except ValueError as error:
        parser.error(str(error))
    try:
        cupy, device = _device()
    except RuntimeError as error:
        print(f"python -m collectives bench kernels {error}", file=sys.stderr)
        return 2
    torch = _torch(cupy)
    storage = "uint16" if args.datatype == "bfloat16" else args.datatype
    itemsize = np.dtype(storage).itemsize
    print(
        f"# collectives kernels on {device}, {args.datatype} {args.op}; CuPy {cupy.__version__}", flush=True
    )
    print(f"# median of {args.iters} calls after {args.warmup} warmup, timed with CUDA events", flush=True)
    print("# GB/s = (bytes read + bytes written) / time; 'of copy' = GB/s / the copy's GB/s", flush=True)
    notes: list[str] = []
    measurements: list[Measurement] = []
    header_printed = False
    for size in sizes:
        count = size // itemsize
        if count == 0:
            continue
        buffers = [cupy.zeros(count, dtype=storage) for _ in range(INPUTS + 1)]
        for name, call in _contenders(cupy, torch, args.op, args.datatype, buffers, notes).items():
            times = _time(cupy, call, args.iters, args.warmup)
            measurements.append(Measurement(count * itemsize, name, bytes_moved(name, 1), times))
        del buffers
        cupy.get_default_memory_pool().free_all_blocks()
        lines = format_table([m for m in measurements if m.size == count * itemsize])
        print("\n".join(lines if not header_printed else lines[1:]), flush=True)
        header_printed = True
    for note in dict.fromkeys(notes):
        print(f"# {note}")
    if args.json is not None:
        metadata = {
            "device": device,
            "cupy": cupy.__version__,
            "torch": None if torch is None else torch.__version__,
            "dtype": args.datatype,
            "op": args.op,
            "iters": args.iters,
            "warmup": args.warmup,
            "notes": list(dict.fromkeys(notes)),
        }
        args.json.write_text(json.dumps(to_json(measurements, metadata), indent=2) + "\n")
    return 0
