"""Surviving a rank's death under Open MPI with ULFM: the MPI's own behaviour, then the library's."""

import json

import pytest

from tests.ulfm.launch import INSTALL, openmpi_prefix, run_ulfm

pytestmark = pytest.mark.skipif(
    openmpi_prefix() is None, reason=f"no Open MPI for the ULFM tests (bash .ci/run installs it: {INSTALL})"
)


def _lines(output: str, tag: str) -> list[dict[str, object]]:
    return [json.loads(line.split(tag, 1)[1]) for line in output.splitlines() if line.startswith(tag)]


@pytest.mark.parametrize("how", ["kill", "exit0"])
def test_mpi_reports_a_dead_rank_and_shrinks_past_it(how: str) -> None:
    # the facts the library builds on: a dead peer fails blocking and nonblocking calls at once
    # (MPI_ERR_PROC_FAILED, or MPI_ERR_REVOKED where a survivor's collective revoked it), the
    # survivors agree and shrink to a working communicator
    result = run_ulfm(3, ["-m", "tests.ulfm.probe", how], timeout=60)
    seen = _lines(result.stdout, "PROBE ")
    assert sorted(s["rank"] for s in seen) == [0, 1], result.stdout
    for survivor in seen:
        for call in ("blocking", "nonblocking", "p2p"):
            attempt = survivor[call]
            assert isinstance(attempt, dict)
            assert attempt["error"] in ("MPI_ERR_PROC_FAILED", "MPI_ERR_REVOKED", "MPI_ERR_IN_STATUS"), seen
        assert survivor["revoked"]["error"] == "MPI_ERR_REVOKED"  # type: ignore[index]
        # a receive from the dead rank fails where its status is asked for (the transport asks)
        assert survivor["p2p_status_errors"][0] != 0  # type: ignore[index]
        assert survivor["failed"] == [2]
        assert survivor["agreed"] == 5  # 5 & 7
        assert survivor["shrunk"] == {"size": 2, "rank": survivor["rank"], "sum": 2.0}
