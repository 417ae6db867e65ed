"""Checkpoints of torch training: model, optimizer and step in a directory, with a store's servers."""

__all__ = ["load_training", "restore_training", "save_training", "training_state"]

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ..errors import CheckpointError, ConfigurationError
from ..files import Codec, register_codec
from ..resilience import folder_of, load, save

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..communicator import Communicator
    from ..kvstore import KVStore

_STORE_FOLDER = "kvstore"  # inside a version's folder: the store's own checkpoint


def _tensor_bytes(tensor: torch.Tensor) -> tuple[np.ndarray, dict[str, Any]]:
    """A dense tensor's bytes (on the CPU, C order) and what makes it again: dtype, shape."""
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise ValueError(f"a {tensor.layout} tensor (quantized: {tensor.is_quantized}); save a dense copy")
    dense = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    raw = dense.reshape(-1).view(torch.uint8).numpy() if dense.numel() else np.zeros(0, np.uint8)
    return raw, {"dtype": str(dense.dtype).removeprefix("torch."), "shape": list(dense.shape),
                 "requires_grad": bool(tensor.requires_grad)}  # fmt: skip


def _tensor_of(buffer: memoryview, fields: dict[str, Any]) -> torch.Tensor:
    """The tensor of :func:`_tensor_bytes`, a view of ``buffer``; ``fields`` checked, not trusted."""
    name, shape = fields.get("dtype"), fields.get("shape")
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"a tensor of shape {shape!r}")
    count = math.prod(shape)
    if count * dtype.itemsize != buffer.nbytes:
        raise ValueError(f"a {name} tensor of shape {tuple(shape)} in a buffer of {buffer.nbytes} bytes")
    if buffer.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)


def _parameter_of(buffer: memoryview, fields: dict[str, Any]) -> torch.nn.Parameter:
    return torch.nn.Parameter(_tensor_of(buffer, fields), requires_grad=fields.get("requires_grad") is True)


# state files (collectives.files) take tensors through these: the file names the codec, this code
# makes the tensor, so loading one runs no code of the file's choosing (as torch.load(weights_only=True))
register_codec(Codec("torch.tensor", torch.Tensor, _tensor_bytes, _tensor_of))
register_codec(Codec("torch.parameter", torch.nn.Parameter, _tensor_bytes, _parameter_of))


def training_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, step: int = 0, **extra: Any
) -> dict[str, Any]:
    """What resumes training: the model's and optimizer's ``state_dict``, the step, and ``extra``.

    For :class:`~collectives.resilience.Checkpointer` or
    :func:`~collectives.resilience.save`; the tensors are the model's own until
    saved (both copy them at once, so a checkpoint is of this moment). ``extra``
    holds values a state file allows (numbers, strings, lists, dicts, arrays,
    tensors...): :func:`save_training` names any other, and where it is.
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
            kv.save(_store_folder(folder))

    return save(directory, state, step, comm=comm, keep=keep, before_manifest=save_store)


def load_training(
    directory: "str | os.PathLike[str]",
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    comm: "Communicator | MPI.Comm | None" = None,
    kv: "KVStore | None" = None,
    trusted: bool = False,
    other_sizes: Literal["raise", "skip"] = "raise",
) -> int | None:
    """Restore the newest complete checkpoint in ``directory``; the steps it had done, ``None`` for none.

    Collective. With ``kv`` (a new store, before any ``init``), the store is
    loaded from the same version; then make its
    :class:`~collectives.torch_integration.KVStoreOptimizer` with ``loaded=True``.
    ``trusted`` and ``other_sizes`` are :func:`~collectives.resilience.load`'s:
    a checkpoint of the old pickled format runs code as it loads, and is read
    only with ``trusted=True``; one of another world size raises unless
    ``other_sizes="skip"``.

    Raises:
        CheckpointError: as :func:`~collectives.resilience.load`, or the state is not a training state.
    """
    found = load(directory, comm=comm, trusted=trusted, other_sizes=other_sizes)
    if found is None:
        return None
    version, state = found
    step = restore_training(state, model, optimizer)
    if kv is not None:
        kv.load(_store_folder(folder_of(directory, version)))
    return step


def _store_folder(version: Path) -> Path:
    """The store's folder inside a version's; never a link, which could lead out of the checkpoint."""
    folder = version / _STORE_FOLDER
    if folder.is_symlink():
        raise CheckpointError(
            f"{str(folder)!r} is a symbolic link; a store's checkpoint is not followed out of it"
        )
    return folder
