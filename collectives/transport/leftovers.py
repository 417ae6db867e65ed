"""Shared-memory files that killed MPI jobs left in /dev/shm: which are stale, and removing them."""

__all__ = ["PATTERNS", "SHM_DIR", "STALE_AFTER_S", "in_use", "main", "remove_stale", "stale_segments"]

import argparse
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

SHM_DIR = Path("/dev/shm")

# The library names no shared-memory file of its own: its shared memory is MPI's shared windows
# (Win.Allocate_shared), named by MPICH. Measured with the mpich wheel (MPICH 5, ch4): a window is
# /dev/shm/mpich_shar_tmp*, unlinked as soon as every rank of the node has mapped it, so a job
# killed mid-collective leaves none; it leaves MPICH's own segment for the node, made at MPI_Init
# as mpich_shm_<id>_<n> and unlinked only by MPI_Finalize, which a killed job never reaches (and
# mpiexec does not remove it after the kill).
PATTERNS = ("mpich_shm_*", "mpich_shar_tmp*")
"""MPICH's node segment (made at ``MPI_Init``), and a shared window not yet unlinked."""
STALE_AFTER_S = 60.0


def in_use() -> set[str]:
    """The paths every process this one can read maps or holds open (``/proc/*/maps``, ``/proc/*/fd``)."""
    used: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6:
                        used.add(parts[5].strip().removesuffix(" (deleted)"))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                used.add(os.readlink(f"/proc/{pid}/fd/{fd}").removesuffix(" (deleted)"))
        except OSError:  # gone meanwhile, or another user's
            continue
    return used


def stale_segments(
    paths: Iterable[Path] | None = None, *, directory: Path = SHM_DIR, older_than: float = STALE_AFTER_S
) -> list[Path]:
    """The stale files among ``paths``, or among ``directory``'s files.

    No name says which job made a file, so a file is stale when it matches
    :data:`PATTERNS`, belongs to this user, is neither mapped nor open in any
    process this one can see, and has not changed for ``older_than`` seconds (a
    rank of a starting job maps its file within moments of making it). Nothing
    removes them automatically: ranks on a node that shares /dev/shm with another
    PID namespace (another container) cannot see whether its processes use a file.

    Args:
        paths: the files to consider; all in ``directory`` matching :data:`PATTERNS` when omitted.
        directory: where MPI's shared-memory files are.
        older_than: seconds a file must have gone unchanged.
    """
    if paths is None:
        paths = sorted({p for pattern in PATTERNS for p in directory.glob(pattern)})
    now = time.time()
    used = in_use()
    stale = []
    for path in paths:
        try:
            status = path.stat()
        except OSError:
            continue
        matches = any(path.match(pattern) for pattern in PATTERNS)
        old = now - status.st_mtime >= older_than
        if matches and old and status.st_uid == os.getuid() and str(path) not in used:
            stale.append(path)
    return stale


def remove_stale(
    paths: Iterable[Path] | None = None, *, directory: Path = SHM_DIR, older_than: float = STALE_AFTER_S
) -> list[Path]:
    """Unlink the files :func:`stale_segments` finds (same arguments); the ones removed."""
    removed = []
    for path in stale_segments(paths, directory=directory, older_than=older_than):
        try:
            path.unlink()
        except FileNotFoundError:  # another cleaner was first
            continue
        removed.append(path)
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m collectives.transport.leftovers [--dry-run] [--older-than S]``: list or remove them."""
    parser = argparse.ArgumentParser(prog="python -m collectives.transport.leftovers", description=__doc__)
    parser.add_argument("--dry-run", action="store_true", help="list the stale files, remove nothing")
    parser.add_argument("--older-than", type=float, default=STALE_AFTER_S, metavar="S")
    parser.add_argument("--directory", type=Path, default=SHM_DIR)
    args = parser.parse_args(argv)
    act = stale_segments if args.dry_run else remove_stale
    for path in act(directory=args.directory, older_than=args.older_than):
        print(("stale " if args.dry_run else "removed ") + str(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
