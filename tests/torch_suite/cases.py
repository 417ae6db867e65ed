"""Launching torch's ``distributed_test`` cases under mpiexec, going on past a case that hangs or crashes.

Also a command to measure a backend over every case::

    python -m tests.torch_suite.cases gloo results.json [CASE ...]
"""

import ast
import contextlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mpirun import run_mpi

RANKS = 2
RUNNER = "tests/torch_suite/run_cases.py"
HERE = Path(__file__).resolve().parent


def all_cases() -> list[str]:
    """The names of the cases of torch's ``DistributedTest._DistTestBase``, read without importing it."""
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("torch's distributed_test is not installed")
    tree = ast.parse(Path(spec.origin).read_text())
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "_DistTestBase":
            names += [
                f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
            ]
    return names


def listed(name: str) -> dict[str, str]:
    """A list in this folder: case name, then `` - `` and the reason, one a line; ``#`` starts a comment."""
    entries = {}
    for line in (HERE / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            case, _, reason = line.partition(" - ")
            entries[case.strip()] = reason.strip()
    return entries


def _outcomes(results_dir: Path) -> dict[str, tuple[str, str]]:
    """Each case's outcome over the ranks: failed (timeout) anywhere, else skipped anywhere, else passed."""
    per_case: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(results_dir.glob("rank*.jsonl")):
        started: str | None = None
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["outcome"] == "started":
                started = record["case"]
                continue
            per_case.setdefault(record["case"], []).append((record["outcome"], record.get("detail", "")))
            started = None
        if started is not None:  # the job ended inside it, by another rank's timeout or a crash
            per_case.setdefault(started, []).append(("failed", "the job ended during the case"))
    combined = {}
    for case, seen in per_case.items():
        for outcome in ("timeout", "failed", "skipped", "passed"):
            details = [detail for o, detail in seen if o == outcome]
            if details:
                combined[case] = ("failed" if outcome == "timeout" else outcome, details[0])
                break
    return combined


def run_cases(
    backend: str, cases: list[str], job_timeout: float, keep: Path | None = None
) -> dict[str, tuple[str, str]]:
    """Each case's outcome on ``backend`` at 2 ranks: ``(passed|failed|skipped, detail)``.

    Cases run in as few mpiexec jobs as they can; a job that ends early (a case
    timed out or crashed) is started again from the case after the last one done.
    All jobs together run at most ``job_timeout`` seconds; cases not reached are
    left out of the answer. ``keep``: a folder to leave the ranks' result lines in.
    """
    deadline = time.monotonic() + job_timeout
    outcomes: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="torch-suite-results-") as scratch:
        results = keep or Path(scratch)
        while (left := [c for c in cases if c not in outcomes]) and (
            budget := deadline - time.monotonic()
        ) > 5:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run_mpi(RANKS, [RUNNER, backend, str(results), *left], timeout=budget)
            found = _outcomes(results)
            if not set(found) - set(outcomes):
                break  # the job did nothing (it failed to start): do not loop on it
            outcomes = found
    return outcomes


def main(argv: list[str]) -> None:
    backend, out, *cases = argv
    start = time.monotonic()
    keep = Path(out).with_suffix(".ranks")
    keep.mkdir(exist_ok=True)
    outcomes = run_cases(backend, cases or all_cases(), job_timeout=3600, keep=keep)
    counts = {kind: sum(o == kind for o, _ in outcomes.values()) for kind in ("passed", "failed", "skipped")}
    Path(out).write_text(json.dumps({"counts": counts, "cases": outcomes}, indent=1))
    print(backend, counts, f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
