"""Runs cases of torch's own ``distributed_test`` at every rank of an mpiexec job, one result line each.

Usage (under ``mpiexec -n 2``)::

    python tests/torch_suite/run_cases.py BACKEND RESULTS_DIR CASE [CASE ...]

Each case gets a fresh default process group of ``BACKEND`` (``init_method="mpi://"``),
as torch's own harness gives each case a fresh process. ``collectives:as-gloo`` runs
the cases torch's decorators keep for gloo alone: the test module is told its backend is
gloo while every group is a collectives one (a case that makes a group of another backend
fails, as it would not test this one). Every rank appends to
``RESULTS_DIR/rank<r>.jsonl`` a ``started`` line, then the case's outcome
(``passed``, ``failed`` or ``skipped``). A case that runs longer than
``$CASE_TIMEOUT_S`` ends the job (the rank writes ``timeout`` first), so the
launcher (tests/torch_suite/cases.py) goes on with the cases after it.
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import types
import unittest
from datetime import timedelta
from pathlib import Path
from typing import Any

from mpi4py import MPI

WORLD = MPI.COMM_WORLD
os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
CASE_TIMEOUT_S = float(os.environ.get("CASE_TIMEOUT_S", "30"))
PG_TIMEOUT_S = 20.0  # a collective stuck on a failed peer raises before the case's own bound


def _environment(backend: str, results_dir: str) -> None:
    """What distributed_test reads at import: its backend, world size and a directory every rank shares."""
    shared = tempfile.mkdtemp(prefix="shared-", dir=results_dir) if WORLD.rank == 0 else None
    shared = WORLD.bcast(shared)
    if WORLD.rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(shared, sub), exist_ok=True)
    WORLD.Barrier()
    os.environ.update(
        BACKEND=backend,
        WORLD_SIZE=str(WORLD.size),
        TEMP_DIR=shared,
        INIT_METHOD="mpi://",
        MASTER_ADDR="127.0.0.1",
    )


def _stand_in_for_expecttest() -> None:
    """torch's test helpers import ``expecttest`` (a test-only package) for a base class; unittest's does."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stand_in.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stand_in


def _case_class(backend: str) -> Any:
    _stand_in_for_expecttest()
    import torch.testing._internal.common_distributed as common

    # the suite's feature tables name the backends its decorators let through; the collectives
    # backend claims the cpu ones gloo has (ddp, subgroups) and is a plugin
    for feature in ("ddp", "subgroup", "plugin"):
        common.DistTestCases.backend_feature[feature].add("collectives")
    from torch.testing._internal.common_utils import TestCase
    from torch.testing._internal.distributed.distributed_test import DistributedTest

    import collectives.torch_integration  # noqa: F401 - registers the backend and mpi://

    class Case(DistributedTest._DistTestBase, TestCase):  # type: ignore[misc, name-defined]
        pass

    return Case


def _skip_codes() -> dict[int, str]:
    from torch.testing._internal.common_distributed import TEST_SKIPS

    return {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}


def _watch(case: str, results: Any, done: threading.Event) -> None:
    if not done.wait(CASE_TIMEOUT_S):
        results.write(json.dumps({"case": case, "outcome": "timeout", "detail": f"over {CASE_TIMEOUT_S} s"}))
        results.write("\n")
        results.flush()
        os._exit(3)


def _other_backends() -> list[str]:
    """The backends of the groups alive now other than collectives (a case may make its own)."""
    import torch.distributed as dist

    found = {str(backend) for backend, _ in dist.distributed_c10d._world.pg_map.values()}
    return sorted(found - {"collectives"})


def _run(case_class: Any, backend: str, case: str, skips: dict[int, str]) -> tuple[str, str]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.distributed_test import Barrier

    WORLD.Barrier()
    if WORLD.rank == 0:
        Barrier.init()
    WORLD.Barrier()
    Barrier.barrier_id = 0
    method = getattr(case_class, case)
    if getattr(method, "__unittest_skip__", False):  # unittest's runner would skip it, not call it
        return "skipped", str(getattr(method, "__unittest_skip_why__", ""))
    try:
        test = case_class(case)
    except Exception:
        return "failed", traceback.format_exc()
    test.rank = WORLD.rank
    test.file_name = os.path.join(os.environ["TEMP_DIR"], "init_dir", "file")
    try:
        dist.init_process_group(backend, init_method="mpi://", timeout=timedelta(seconds=PG_TIMEOUT_S))
        test.setUp()
        getattr(test, case)()
        outcome, detail = "passed", ""
        if backend == "collectives" and (others := _other_backends()):
            outcome, detail = "failed", f"the case made groups of {others}, not of the collectives backend"
    except unittest.SkipTest as skip:
        outcome, detail = "skipped", str(skip)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        outcome, detail = ("skipped", skips[code]) if code in skips else ("failed", f"exit {exit_.code}")
    except BaseException:
        outcome, detail = "failed", traceback.format_exc(limit=-6)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                outcome, detail = "failed", traceback.format_exc(limit=-3)
    return outcome, detail


def main(argv: list[str]) -> None:
    spec, results_dir, *cases = argv
    backend, _, mode = spec.partition(":")
    _environment("gloo" if mode == "as-gloo" else backend, results_dir)
    case_class = _case_class(backend)
    skips = _skip_codes()
    with open(Path(results_dir) / f"rank{WORLD.rank}.jsonl", "a") as results:
        for case in cases:
            results.write(json.dumps({"case": case, "outcome": "started"}) + "\n")
            results.flush()
            done = threading.Event()
            threading.Thread(target=_watch, args=(case, results, done), daemon=True).start()
            start = time.monotonic()
            outcome, detail = _run(case_class, backend, case, skips)
            done.set()
            line = {"case": case, "outcome": outcome, "seconds": round(time.monotonic() - start, 2)}
            results.write(json.dumps({**line, "detail": detail[-3000:]}) + "\n")
            results.flush()
    WORLD.Barrier()
    if WORLD.rank == 0:
        shutil.rmtree(os.environ["TEMP_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
