"""Checkpoints of torch training: model, optimizer and step in a directory, with a store's servers."""

__all__ = ["load_training", "restore_training", "save_training", "training_state"]

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigurationError
from ..resilience import folder_of, load, save
from ..resilience.checkpoint import CheckpointError

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..communicator import Communicator
    from ..kvstore import KVStore

_STORE_FOLDER = "kvstore"  # inside a version's folder: the store's own checkpoint


def training_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, step: int = 0, **extra: Any
) -> dict[str, Any]:
    """What resumes training: the model's and optimizer's ``state_dict``, the step, and ``extra``.

    Picklable, for :class:`~collectives.resilience.Checkpointer` or
    :func:`~collectives.resilience.save`; the tensors are the model's own until
    pickled (both pickle at once, so a checkpoint is of this moment).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigurationError(f"step must be a non-negative integer, got {step!r}")
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "extra": extra,
    }


def restore_training(
    state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> int:
    """Load ``state`` (from :func:`training_state`) into ``model`` and ``optimizer``; the step it was at.

    Raises:
        CheckpointError: ``state`` is not a training state, or has no optimizer state for ``optimizer``.
    """
    if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= state.keys():
        raise CheckpointError("not a training state (made by training_state): no step, model, optimizer")
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise CheckpointError("the checkpoint holds no optimizer state to restore")
        optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_training(
    directory: "str | os.PathLike[str]",
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    comm: "Communicator | MPI.Comm | None" = None,
    keep: int = 2,
    kv: "KVStore | None" = None,
    **extra: Any,
) -> Path:
    """Save the training state of ``step`` (steps done) as that version in ``directory``; collective.

    Every rank saves its own (the same parameters, where they agree, are kept by
    each: a relaunch needs nothing from another rank). With ``kv``, the store's
    servers save their shards and optimizer state inside the version's folder
    (``kv.save``) before it is marked complete, so both are of the same step.

    Returns:
        The version's folder.
    """
    state = training_state(model, optimizer, step, **extra)

    def save_store(folder: Path) -> None:
        if kv is not None:
            kv.save(folder / _STORE_FOLDER)

    return save(directory, state, step, comm=comm, keep=keep, before_manifest=save_store)


def load_training(
    directory: "str | os.PathLike[str]",
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    comm: "Communicator | MPI.Comm | None" = None,
    kv: "KVStore | None" = None,
) -> int | None:
    """Restore the newest complete checkpoint in ``directory``; the steps it had done, ``None`` for none.

    Collective. With ``kv`` (a new store, before any ``init``), the store is
    loaded from the same version; then make its
    :class:`~collectives.torch_integration.KVStoreOptimizer` with ``loaded=True``.
    """
    found = load(directory, comm=comm)
    if found is None:
        return None
    version, state = found
    step = restore_training(state, model, optimizer)
    if kv is not None:
        kv.load(folder_of(directory, version) / _STORE_FOLDER)
    return step
