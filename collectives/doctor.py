"""``python -m collectives info``: what this machine and job offer the library, for users and bug reports.

As ``ompi_info`` and ``python -m torch.utils.collect_env`` do: the versions, the
MPI library and the thread level it granted, how the job's ranks lie on nodes,
shared memory, whether a rank may read another's memory, the calibration the
selector uses, torch, CuPy and a GPU, and Open MPI's fault tolerance. Under
``mpiexec`` every rank takes part (the node split is collective) and rank 0 prints.
"""

__all__ = ["gather", "main", "render"]

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, engine
from .calibration import calibration_path, load_model
from .errors import CollectivesError
from .transport import cross_memory

_PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _shared_memory() -> dict[str, Any]:
    """The size of /dev/shm (where MPI's shared windows live on Linux) and the page size."""
    facts: dict[str, Any] = {"page_bytes": os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else None}
    try:
        stats = os.statvfs("/dev/shm")
        facts["dev_shm_bytes"] = stats.f_blocks * stats.f_frsize
        facts["dev_shm_free_bytes"] = stats.f_bavail * stats.f_frsize
    except OSError as error:
        facts["dev_shm"] = f"unavailable: {error.strerror}"
    return facts


def _cross_memory() -> str:
    """Whether this process may read a process's memory as cross-memory attach does (its own here)."""
    if not cross_memory.available():
        return "no: this C library has no process_vm_readv"
    word, seen = ctypes.c_int64(12345), ctypes.c_int64(0)
    try:
        cross_memory.read(os.getpid(), ctypes.addressof(word), ctypes.addressof(seen), 8)
    except OSError as error:
        return f"no: {error.strerror}"
    scope = _PTRACE_SCOPE.read_text().strip() if _PTRACE_SCOPE.exists() else None
    if seen.value != word.value:
        return "no: process_vm_readv read another value"
    if scope not in (None, "0"):
        return f"own memory only (Yama ptrace_scope {scope}: ranks cannot read each other's)"
    return "yes (process_vm_readv)"


def _optional() -> dict[str, Any]:
    """torch, CuPy and a GPU, without importing what is absent."""
    facts: dict[str, Any] = {"torch": _version("torch"), "cupy": None, "gpu": None}
    for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy"):
        if (found := _version(name)) is not None:
            facts["cupy"] = f"{found} ({name})"
            break
    if facts["torch"] is not None:
        try:
            import torch

            if torch.cuda.is_available():
                facts["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (torch)"
            else:
                facts["gpu"] = "none seen by torch"
        except Exception as error:  # a broken install is worth reporting, not raising
            facts["torch"] = f"{facts['torch']} (fails to import: {error})"
    return facts


def _calibration(world_size: int) -> dict[str, Any]:
    try:
        model = load_model(world_size=world_size)
    except CollectivesError as error:
        return {"path": str(calibration_path()), "error": str(error)}
    return {
        "path": str(calibration_path()),
        "source": model.source,
        "alpha_us": model.alpha * 1e6,
        "beta_ns_per_byte": model.beta * 1e9,
        "gamma_ns_per_byte": model.gamma * 1e9,
        "barrier_us": model.barrier * 1e6,
    }


def gather() -> dict[str, Any]:
    """Everything ``info`` reports, as JSON-ready data; collective over ``MPI.COMM_WORLD``."""
    from .communicator import Communicator
    from .transport.mpi import ulfm_missing
    from .transport.mpi.about import library

    comm = Communicator()
    try:
        features = sorted(comm.features)  # under the timeout: a rank that never comes is named
    finally:
        comm.free()
    mpi = library()  # its node split is MPI's own, unbounded: only once every rank has come
    missing = ulfm_missing()
    return {
        "collectives": __version__,
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "numpy": np.__version__,
        "mpi": mpi,
        "features": features,
        "shared_memory": _shared_memory(),
        "cross_memory_attach": _cross_memory(),
        "engine": engine.why(),
        "calibration": _calibration(mpi["world_size"]),
        "ulfm": "yes" if missing is None else f"no: {missing}",
        **_optional(),
    }


def _bytes(value: object) -> str:
    if not isinstance(value, int):
        return str(value)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def render(facts: dict[str, Any]) -> list[str]:
    """``facts`` (from :func:`gather`) as aligned lines of text."""
    mpi, shared, calibration = facts["mpi"], facts["shared_memory"], facts["calibration"]
    if "error" in calibration:
        constants = f"unreadable: {calibration['error']}"
    else:
        constants = (
            f"{calibration['source']}: alpha {calibration['alpha_us']:.2f} us, "
            f"beta {calibration['beta_ns_per_byte']:.3f} ns/B, "
            f"gamma {calibration['gamma_ns_per_byte']:.3f} ns/B, "
            f"barrier {calibration['barrier_us']:.2f} us"
        )
    if "dev_shm_bytes" in shared:
        memory = f"/dev/shm {_bytes(shared['dev_shm_bytes'])} ({_bytes(shared['dev_shm_free_bytes'])} free)"
    else:
        memory = f"/dev/shm {shared.get('dev_shm')}"
    level = mpi["thread_level"]
    if level != "multiple":
        level += " (non-blocking calls run inline, no worker thread)"
    rows = [
        ("collectives", facts["collectives"]),
        ("python", facts["python"]),
        ("platform", facts["platform"]),
        ("numpy", facts["numpy"]),
        ("MPI library", f"{mpi['library']} (MPI {mpi['standard']}, mpi4py {mpi['mpi4py']})"),
        ("thread level", level),
        ("launcher", mpi["launcher"]),
        ("ranks", f"{mpi['world_size']} on {mpi['nodes']} node(s), {mpi['ranks_on_this_node']} on rank 0's "
                  f"({mpi['processor']})"),
        ("features", ", ".join(facts["features"]) or "none"),
        ("shared memory", f"{memory}, pages of {_bytes(shared['page_bytes'])}"),
        ("cross-memory attach", facts["cross_memory_attach"]),
        ("engine", facts["engine"]),
        ("calibration", constants),
        ("fault tolerance (ULFM)", facts["ulfm"]),
        ("torch", facts["torch"] or "not installed"),
        ("cupy", facts["cupy"] or "not installed"),
        ("GPU", facts["gpu"] or "unknown (no torch)"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return [f"{name.ljust(width)} : {value}" for name, value in rows]


def main(argv: list[str]) -> int:
    """Print the report on rank 0 (``--json`` for a bug report); every rank takes part."""
    parser = argparse.ArgumentParser(
        prog="python -m collectives info", description="What this machine and job offer collectives."
    )
    parser.add_argument("--json", action="store_true", help="print JSON, for a bug report")
    args = parser.parse_args(argv)
    facts = gather()
    if facts["mpi"]["rank"] == 0:
        print(json.dumps(facts, indent=2) if args.json else "\n".join(render(facts)), flush=True)
    return 0
