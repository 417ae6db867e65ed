"""Horovod Elastic on MPI: a training function that goes on from its last commit after a rank dies.

Horovod's elastic mode re-runs the training function on the workers left after
one is lost, from the last state every worker committed. Here the workers are
MPI ranks and the loss of one is survived as :mod:`collectives.resilience` does
(Open MPI 5 under ``mpiexec --with-ft ulfm``): a collective that fails because a
peer died raises on the survivors; :func:`run_fn`'s wrapper restores the state's
last commit, shrinks the world to the survivors (the ``reset`` it is given),
calls the reset callbacks, brings every survivor to rank 0's state (``sync``)
and calls the function again. Without fault tolerance the first failure ends
the run with the error, which then names why it could not go on.

No driver announces hosts here. With ``$COLLECTIVES_ELASTIC_REPLACE=1`` the
world grows back instead: after a loss the survivors go on, and at their next
commit :meth:`State.check_host_updates` raises :class:`HostsUpdatedInterrupt`
(Horovod's meaning: hosts are about to be added); the reset then starts a new
process per lost rank (``MPI_Comm_spawn`` of this program's command line,
:func:`collectives.resilience.grow`), numbered after the survivors; its
``hvd.init()`` joins them and its first ``sync`` gives it rank 0's commit.
"""

__all__ = [
    "REPLACE_ENV",
    "Elastic",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run_fn",
    "survive",
]

import copy
import functools
import pickle
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..._env import env_flag
from ...communicator import communicator_of
from ...errors import ConfigurationError, TransportError
from ...resilience import fault_tolerance_missing, grow, hung_ranks, join_grown, shrink
from ..collective_jobs import broadcast_bytes
from ..mpi_ops import broadcast_optimizer_state, broadcast_parameters

R = TypeVar("R")

REPLACE_ENV = "COLLECTIVES_ELASTIC_REPLACE"
"""Set to 1: a lost rank is replaced by a new process at the survivors' next commit (needs ULFM)."""


class _Hosts:
    """The processes to start at the next commit: what Horovod's driver would announce.

    One per process, as Horovod's own notification manager is: a state object
    learns of host changes without being handed anything.
    """

    def __init__(self) -> None:
        self.pending = 0


_hosts = _Hosts()


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed: the training function starts again (after a sync unless ``skip_sync``)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts changed")
        self.skip_sync = skip_sync


def _broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (pickled: it travels between the job's own ranks)."""
    world = communicator_of(None)
    payload = pickle.dumps(obj) if world.rank == root_rank else b""
    data = broadcast_bytes(payload, root_rank, world)
    return obj if world.rank == root_rank else pickle.loads(data)


def _rank() -> int:
    return communicator_of(None).rank


class State:
    """What every worker keeps in memory at each commit, goes back to after a failure, and syncs.

    Args:
        bcast_object: broadcasts a picklable object from a rank to all (rank 0's is used).
        get_rank: this worker's rank.
    """

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = _broadcast_object,
        get_rank: Callable[[], int] = _rank,
    ) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Call ``callbacks`` after every reset (a worker lost), e.g. to scale the learning rate anew."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After the world changed: :meth:`reset`, then the callbacks, in the order registered."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the state as it is now (:meth:`save`), then :meth:`check_host_updates`."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` where lost ranks are to be replaced (:data:`REPLACE_ENV`).

        Every survivor learns of them in the same reset, so all raise at the same commit.
        """
        if _hosts.pending:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        """Keep the state in this worker's memory."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last :meth:`save`, undoing what changed since."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every worker rank 0's state."""
        raise NotImplementedError

    def reset(self) -> None:
        """Follow the world's change before the next sync (nothing, unless a subclass needs it)."""


class ObjectState(State):
    """Plain Python values, given as keyword arguments and kept as attributes.

    A commit keeps a deep copy of each, so that a failure undoes what changed
    after it (an item appended to a list, say).
    """

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = _broadcast_object,
        get_rank: Callable[[], int] = _rank,
        **kwargs: Any,
    ) -> None:
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


class TorchState(ObjectState):
    """A model's and an optimizer's state (any of them may be ``None``), and plain values as keywords.

    A commit keeps copies of ``model.state_dict()`` and ``optimizer.state_dict()``;
    a sync broadcasts rank 0's parameters and optimizer state; after a reset a
    ``DistributedOptimizer`` reduces on the survivors.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._saved_model: dict[str, Any] | None = None
        self._saved_optimizer: dict[str, Any] | None = None
        super().__init__(**kwargs)
        self._save_torch()

    def _save_torch(self) -> None:
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())

    def save(self) -> None:
        self._save_torch()
        super().save()

    def restore(self) -> None:
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        super().restore()

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()
        self._save_torch()  # a new rank's commit is rank 0's, not its own initial model

    def reset(self) -> None:
        move_to = getattr(self.optimizer, "move_to", None)
        if move_to is not None:  # a DistributedOptimizer: it reduces on the survivors from now on
            move_to()


def run_fn(func: Callable[..., R], reset: Callable[[BaseException], None]) -> Callable[..., R]:
    """``func(state, ...)`` run again from ``state``'s last commit after a worker is lost, until it returns.

    ``reset(error)`` makes the world anew on the survivors of the failure
    ``error``, or with the hosts a :class:`HostsUpdatedInterrupt` ``error``
    announced; it raises where it cannot (no fault tolerance), and that ends the run.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                reset(interrupt)
            except TransportError as error:  # a peer died, or hung past the timeout
                state.restore()
                skip_sync = False
                reset(error)
            state.on_reset()

    return wrapper


def survive(error: BaseException, comm: Any = None) -> int:
    """Shrink the default communicator to the survivors of ``error`` (a lost or hung rank); the number lost.

    Collective over the survivors.

    Raises:
        ConfigurationError: this MPI cannot survive a lost rank (saying why), or
            the world is another communicator than the default one.
    """
    missing = fault_tolerance_missing()
    if missing is not None:
        raise ConfigurationError(
            f"elastic training cannot go on after {type(error).__name__}: {missing}"
        ) from error
    if comm is not None:
        raise ConfigurationError(
            "elastic training runs over the default communicator (hvd.init())"
        ) from error
    shrunk = shrink(None, hung=hung_ranks(error))  # the default communicator is the survivors' from now on
    return len(shrunk.lost)


class Elastic:
    """``hvd.elastic``: :func:`run` over a facade's world, and the state classes.

    Args:
        new_world: makes the facade's world anew once the default communicator is the survivors'.
        world: the communicator the facade was given (``None`` for the default one).

    Attributes:
        State, ObjectState, TorchState, HostsUpdatedInterrupt: as in this module.
    """

    State = State
    ObjectState = ObjectState
    TorchState = TorchState
    HostsUpdatedInterrupt = HostsUpdatedInterrupt

    def __init__(self, new_world: Callable[[], None], world: Callable[[], Any]) -> None:
        self._new_world = new_world
        self._world = world
        self._entered = False

    def enter(self, comm: Any) -> None:
        """Before ``hvd.init`` makes its world: in a process started to replace a lost rank, join the job.

        Only once per process, only over the default communicator and only with
        ``$COLLECTIVES_ELASTIC_REPLACE`` set (the new process inherits it), so that
        no other program spawned by MPI is taken for one.
        """
        if self._entered or comm is not None:
            return
        self._entered = True
        if env_flag(REPLACE_ENV):
            join_grown()

    def _reset(self, error: BaseException) -> None:
        if isinstance(error, HostsUpdatedInterrupt):
            count, _hosts.pending = _hosts.pending, 0
            if count:  # the same command line as this process's, in the lost ranks' places
                grow([sys.executable, *sys.orig_argv[1:]], count)
        else:
            lost = survive(error, self._world())
            if env_flag(REPLACE_ENV):
                _hosts.pending += lost
        self._new_world()

    def run(self, func: Callable[..., R]) -> Callable[..., R]:
        """The decorator: ``func(state, ...)`` goes on from ``state``'s last commit after a worker is lost."""
        return run_fn(func, self._reset)
