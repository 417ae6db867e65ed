"""torch's own distributed_test cases against the collectives backend at 2 ranks, under mpiexec.

tests/torch_suite/gloo_passes.txt lists the cases of the installed torch's
``DistributedTest._DistTestBase`` that pass on gloo at 2 ranks on the CPU (measured with
``python -m tests.torch_suite.cases gloo OUT.json``). Each must pass on the collectives
backend too, unless tests/torch_suite/not_on_collectives.txt names it with the reason.
The cases torch's decorators keep for gloo alone (sparse allreduce, coalesced allreduce,
batched sends, objects, DDP's futures ...) run again with the test module told its backend
is gloo while every group is a collectives one (``collectives:as-gloo``).
"""

import time

import pytest

pytest.importorskip("torch", reason="torch's own test cases need torch (pip install torch==2.13.0)")

from tests.mpirun import mpiexec
from tests.torch_suite.cases import all_cases, listed, run_cases

JOB_TIMEOUT_S = 300  # every job together; measured 90 to 100 s on 2 cores shared with other jobs


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_every_case_gloo_passes_passes_on_collectives_or_is_listed() -> None:
    present = set(all_cases())
    passes_on_gloo = [case for case in listed("gloo_passes.txt") if case in present]
    if not passes_on_gloo:
        pytest.skip("the installed torch has none of the cases measured with torch 2.13.0")
    exceptions = listed("not_on_collectives.txt")
    assert set(exceptions) <= set(listed("gloo_passes.txt")), "a listed case is not one gloo passes"
    assert all(exceptions.values()), "every listed case needs its reason"
    cases = [case for case in passes_on_gloo if case not in exceptions]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    outcomes = run_cases("collectives", cases, job_timeout=JOB_TIMEOUT_S * 0.75)
    kept_for_gloo = [case for case, (outcome, _) in outcomes.items() if outcome == "skipped"]
    if kept_for_gloo:
        left = deadline - time.monotonic()
        outcomes.update(run_cases("collectives:as-gloo", kept_for_gloo, job_timeout=left))
    missing = [case for case in cases if case not in outcomes]
    failed = {case: detail for case, (outcome, detail) in outcomes.items() if outcome != "passed"}
    report = "\n\n".join(f"{case}:\n{detail[-1500:]}" for case, detail in failed.items())
    assert not missing, f"{len(missing)} cases did not run in {JOB_TIMEOUT_S} s: {missing}"
    assert not failed, f"{len(failed)} of {len(cases)} cases failed on collectives:\n{report}"
