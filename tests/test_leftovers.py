"""Shared-memory files a killed job leaves in /dev/shm, and removing the stale ones (issue 19, item 8)."""

import mmap
import os
import subprocess
import time
from pathlib import Path

import pytest

from collectives.transport.leftovers import SHM_DIR, in_use, remove_stale, stale_segments
from tests.mpirun import mpiexec, run_mpi


def _old(path: Path, size: int = 4096) -> Path:
    path.write_bytes(b"\0" * size)
    an_hour_ago = time.time() - 3600
    os.utime(path, (an_hour_ago, an_hour_ago))
    return path


def test_only_old_unused_mpi_files_are_stale(tmp_path: Path) -> None:
    stale = _old(tmp_path / "mpich_shm_1234abcd_0")
    window = _old(tmp_path / "mpich_shar_tmpAbC123")
    recent = tmp_path / "mpich_shm_feed_0"
    recent.write_bytes(b"\0" * 4096)
    other = _old(tmp_path / "someone_elses_file")
    mapped = _old(tmp_path / "mpich_shm_5678_0")
    opened = _old(tmp_path / "mpich_shm_9abc_0")
    with open(mapped, "r+b") as file, mmap.mmap(file.fileno(), 4096), open(opened, "rb"):
        assert str(mapped) in in_use() and str(opened) in in_use()
        assert stale_segments(directory=tmp_path) == [window, stale]
        assert stale_segments([stale, recent, other, mapped], directory=tmp_path) == [stale]
        assert stale_segments(directory=tmp_path, older_than=0) == [window, stale, recent]
        assert remove_stale(directory=tmp_path) == [window, stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (recent, other, mapped, opened)
    )


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
def test_a_job_killed_mid_collective_leaves_no_window_and_its_segments_can_be_removed(tmp_path: Path) -> None:
    try:
        finished = run_mpi(2, ["-m", "tests.faults.leave_shared_memory", str(tmp_path)], timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung after a rank was killed; output:\n{expired.output}")
    assert finished.returncode != 0 and "killed mid-collective" in finished.stdout, finished.stdout
    mapped = {Path(p) for r in (0, 1) for p in (tmp_path / f"rank-{r}.txt").read_text().split()}
    windows = {p for p in mapped if p.name.startswith("mpich_shar_tmp")}
    assert windows, mapped  # the library's shared memory is MPI's windows...
    assert not [p for p in windows if p.exists()]  # ...which MPICH unlinked once mapped
    # what is left is MPICH's own node segment (MPI_Finalize would have unlinked it)
    left = [p for p in mapped if p.exists()]
    assert remove_stale(left, older_than=0) == sorted(left)
    assert not [p for p in mapped if p.exists()], "the killed job's shared memory is still in /dev/shm"
