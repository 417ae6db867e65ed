"""Checkpoints in a directory: a file per rank written atomically, then a manifest once all are durable.

A version's folder ``v<version>`` (zero-padded) holds ``rank-<r>.state`` for every
rank and, once every rank's file is written and synced to disk, ``manifest.json``
naming the version, the world size, the save's id and each rank file's length and
CRC-32. A version is complete when its manifest is there; :func:`load` takes the
newest complete one, so a save cut off anywhere (a rank killed mid-write leaves
only a temporary file, and no manifest) is never loaded, and the one before it is.

A rank's file is a state file (:mod:`collectives.files`): JSON naming values of
an allow-list, the arrays' raw bytes, a checksum; loading it runs no code. Its
header names its rank, version and save, and its length and CRC-32 must be the
manifest's: a file of another rank, version or save is refused, naming it. Only
regular files and folders are read or removed: a symbolic link is refused when
read and only unlinked when pruned, so nothing outside the folder changes. The
old format (``rank-<r>.pkl``, pickled) is read only with ``trusted=True``.
"""

__all__ = ["FORMAT", "LEGACY_FORMAT", "MANIFEST", "complete_versions", "folder_of", "load", "save"]

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..api import allgather, broadcast
from ..communicator import Communicator, communicator_of
from ..errors import CheckpointError, ConfigurationError
from ..faults import CHECKPOINT
from ..faults import PLAN as _FAULTS
from ..files import (
    atomic_write,
    check_json,
    dump_json,
    kind_of,
    read_json,
    read_state,
    state_digest,
    state_pieces,
    sync_folder,
)
from .serial import loads, write_pieces

if TYPE_CHECKING:
    from mpi4py import MPI

FORMAT = "collectives.resilience/3"
LEGACY_FORMAT = "collectives.resilience/1"  # rank files pickled: read only when trusted
_UNOWNED_FORMAT = "collectives.resilience/2"  # rank files that do not name their rank: refused
MANIFEST = "manifest.json"
_DIGITS = 8


def _folder(directory: Path, version: int) -> Path:
    return directory / f"v{version:0{_DIGITS}d}"


def folder_of(directory: "str | os.PathLike[str]", version: int) -> Path:
    """The folder of ``version`` in ``directory`` (where :func:`save`'s ``before_manifest`` writes)."""
    return _folder(Path(directory), version)


def _rank_file(folder: Path, rank: int, legacy: bool = False) -> Path:
    return folder / f"rank-{rank}.{'pkl' if legacy else 'state'}"


def _version_of(name: str) -> int | None:
    digits = name[1:]
    return int(digits) if name.startswith("v") and digits.isdigit() else None


def _write_atomic(path: Path, parts: list[memoryview], rank: int | None = None, what: str = "") -> None:
    """Write ``parts`` to a temporary file beside ``path``, sync it, rename it over ``path``.

    With ``rank``, an armed checkpoint fault of that rank fires halfway through.
    """

    def halfway() -> None:
        assert rank is not None  # only then is it given
        _FAULTS.reached(rank, what, CHECKPOINT)

    hook = halfway if rank is not None and _FAULTS.armed else None
    atomic_write(path, lambda file: write_pieces(file, parts, hook))
    sync_folder(path.parent)


def _manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest in ``folder``, ``None`` if none; a damaged one raises (naming it)."""
    path = folder / MANIFEST
    try:  # written atomically: a manifest there but unreadable (or a link, a FIFO) is damage
        manifest = read_json(path)
    except OSError as error:
        raise CheckpointError(f"{path}: not a manifest ({error.strerror or error})") from None
    if manifest is None:
        return None
    if isinstance(manifest, dict) and manifest.get("format") == LEGACY_FORMAT:
        return manifest  # written before manifests carried a checksum
    manifest = check_json(manifest, str(path))
    if manifest.get("format") == _UNOWNED_FORMAT:
        raise CheckpointError(
            f"{path}: a checkpoint of format {_UNOWNED_FORMAT}, whose rank files do not name their rank "
            "and version: no longer read (save it again)"
        )
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a manifest of format {FORMAT} or {LEGACY_FORMAT}")
    size, files = manifest.get("size"), manifest.get("files")
    if type(manifest.get("checkpoint")) is not str or not isinstance(files, list) or len(files) != size:
        raise CheckpointError(f"{path}: the manifest lacks its checkpoint id or a file per rank")
    for r, entry in enumerate(files):
        if not (
            isinstance(entry, list) and len(entry) == 2 and all(type(n) is int and n >= 0 for n in entry)
        ):
            raise CheckpointError(
                f"{path}: rank {r}'s file is listed as {str(entry)[:40]}, not [bytes, crc32]"
            )
    return manifest


def _readable(folder: Path) -> dict[str, Any] | None:
    try:
        return _manifest(folder)
    except CheckpointError:
        return None


def _complete(root: Path, damaged: dict[int, str] | None = None) -> dict[int, dict[str, Any]]:
    """The manifests of the complete versions in ``root``, by version; what is damaged into ``damaged``.

    A version's folder that is a symbolic link is never followed: damage, not a version.
    """
    found: dict[int, dict[str, Any]] = {}
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        version = _version_of(entry.name)
        kind = None if version is None else kind_of(entry)
        if version is None or kind not in ("folder", "symbolic link"):
            continue
        why = f"{entry} (a symbolic link: never followed)"
        manifest: dict[str, Any] | None = {}
        if kind == "folder":
            try:
                manifest = _manifest(entry)
            except CheckpointError as error:
                why = str(error)
            else:
                why = f"{entry / MANIFEST} (not of version {version})"
        size = None if manifest is None else manifest.get("size")
        if manifest and manifest.get("version") == version and type(size) is int and size > 0:
            found[version] = manifest
        elif manifest is not None and damaged is not None:  # there, whole, yet not a version's: damage
            damaged[version] = why
    return found


def complete_versions(directory: "str | os.PathLike[str]", size: int | None = None) -> list[int]:
    """The versions in ``directory`` with a manifest (of world size ``size`` if given), oldest first."""
    found = _complete(Path(directory))
    return sorted(v for v, m in found.items() if size is None or m["size"] == size)


def _agree_ok(
    group: Communicator,
    error: BaseException | None,
    what: str,
    file: Callable[[int], Path] | None = None,
    digest: tuple[int, int] = (0, 0),
) -> list[tuple[int, int]]:
    """Raise on every rank if ``error`` happened on any (one collective), naming ``file(rank)`` of those.

    Returns:
        Every rank's ``digest``, gathered by the same collective.
    """
    rows = allgather(np.array([error is not None, *digest], np.int64), comm=group).reshape(-1, 3)
    bad = [r for r, flag in enumerate(rows[:, 0]) if flag]
    if not bad:
        return [(int(n), int(crc)) for _, n, crc in rows]
    mine = f": {error}" if error is not None else ""
    others = [str(file(r)) for r in bad if r != group.rank] if file is not None else []
    files = f" ({', '.join(others)})" if others else ""  # this rank's own error names its file
    raise CheckpointError(
        f"rank {group.rank}: {what} failed on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}"
        f"{files}{mine}"
    ) from error


def save(
    directory: "str | os.PathLike[str]",
    state: Any,
    version: int,
    *,
    comm: "Communicator | MPI.Comm | None" = None,
    keep: int = 2,
    before_manifest: Callable[[Path], None] | None = None,
) -> Path:
    """Write this rank's ``state`` as ``version`` of the checkpoints in ``directory``; collective.

    Rank 0 names the save (a random id, broadcast); every rank writes its file
    atomically (a temporary file, synced, renamed), its header naming its rank,
    the version and the save; once every rank has (one ``allgather`` says so,
    with each file's length and CRC-32), rank 0 writes the manifest, and every
    rank returns once the version is complete (another). Then the complete
    versions beyond the newest ``keep`` and the incomplete ones older than
    ``version`` lose their files (a version's folder that is a symbolic link
    loses the link only).

    Args:
        directory: the checkpoints' folder, made if missing (shared by the ranks,
            or the same path on each node).
        state: this rank's state, of None, bool, int, float, str, bytes, list,
            tuple, dict, OrderedDict (torch's ``state_dict``), numpy arrays and
            scalars, and torch tensors (once ``collectives.torch_integration``
            is imported); written as a state file (:mod:`collectives.files`).
        version: a number larger than any complete version's there (the step, say).
        comm: the communicator; the default one when ``None``.
        keep: complete versions kept, this one included.
        before_manifest: collective work that writes more into the version's
            folder (given) before the version is marked complete, on every rank:
            e.g. ``lambda folder: kv.save(folder / "kvstore")``.

    Returns:
        The version's folder.

    Raises:
        CheckpointError: a rank could not write its file, or its state holds a
            value outside the allow-list (on every rank, naming the rank, and
            there where in the state), or the version's folder is there but not
            a folder (a symbolic link, say).
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigurationError(f"a checkpoint's version must be a non-negative integer, got {version!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ConfigurationError(f"keep must be a positive number of versions, got {keep!r}")
    group = communicator_of(comm)
    root = Path(directory)
    folder = _folder(root, version)
    rank, size = group.rank, group.size
    ident = np.frombuffer(os.urandom(16), np.uint8) if rank == 0 else np.zeros(16, np.uint8)
    checkpoint = bytes(broadcast(ident, comm=group)).hex()  # this save's: a file of an earlier one differs
    error: BaseException | None = None
    digest = (0, 0)
    try:
        parts = state_pieces(state, owner={"rank": rank, "version": version, "checkpoint": checkpoint})
        digest = state_digest(parts)
        kind = kind_of(folder)
        if kind not in (None, "folder"):  # written through, a link would reach outside the directory
            raise CheckpointError(f"{folder} is a {kind}, not a folder: refused")
        folder.mkdir(parents=True, exist_ok=True)
        if rank == 0:  # a manifest of an earlier run's save of this version: not this one's
            (folder / MANIFEST).unlink(missing_ok=True)
        for leftover in folder.glob(f".rank-{rank}.*"):  # an earlier write of this rank's, cut off
            leftover.unlink(missing_ok=True)
        _write_atomic(_rank_file(folder, rank), parts, rank, f"checkpoint version {version} in {folder}")
    except Exception as failure:
        error = failure
    files = _agree_ok(group, error, f"writing checkpoint version {version} to {folder}", digest=digest)
    if before_manifest is not None:
        before_manifest(folder)
    # every rank lists before any rank prunes (after the last agreement below), so all prune alike
    older = [v for v in complete_versions(root, size) if v < version]
    doomed = older[: max(len(older) - (keep - 1), 0)]
    error = None
    if rank == 0:
        manifest = {"format": FORMAT, "version": version, "size": size, "checkpoint": checkpoint}
        text = dump_json({**manifest, "files": [list(entry) for entry in files]})
        try:
            _write_atomic(folder / MANIFEST, [memoryview(text)])
        except Exception as failure:
            error = failure
    # also the barrier: no rank returns before the version is complete
    _agree_ok(group, error, f"writing the manifest of checkpoint version {version}")
    _prune(root, doomed, version, rank)
    return folder


def _prune(root: Path, doomed: list[int], version: int, rank: int) -> None:
    """Remove this rank's files of ``doomed`` versions and of incomplete ones older than ``version``.

    The other ranks prune at the same time, and the last one out removes a folder:
    anything may be gone already.
    """
    incomplete = []
    for entry in root.iterdir():
        v = _version_of(entry.name)
        if v is None or v >= version or v in doomed:
            continue
        kind = kind_of(entry)  # a link is not read through: it is no version, and loses the link only
        if kind == "symbolic link" or (kind == "folder" and _readable(entry) is None):
            incomplete.append(v)
    for v in [*doomed, *incomplete]:
        with contextlib.suppress(OSError):
            _remove_files(_folder(root, v), rank)


def _remove_files(folder: Path, rank: int) -> None:
    """Remove this rank's files of ``folder`` (rank 0: the manifest and subfolders too), no link followed."""
    kind = kind_of(folder)
    if kind != "folder":  # a link (to anywhere) loses the link only; its target is not the checkpoint's
        if rank == 0 and kind == "symbolic link":
            folder.unlink()
        return
    if rank == 0:  # first, so a version losing its files is never taken for complete
        (folder / MANIFEST).unlink(missing_ok=True)
        for inner in folder.iterdir():
            if kind_of(inner) == "folder":  # what before_manifest wrote; rmtree follows no link inside
                shutil.rmtree(inner, ignore_errors=True)
            elif kind_of(inner) == "symbolic link":
                inner.unlink()
    _rank_file(folder, rank).unlink(missing_ok=True)
    _rank_file(folder, rank, legacy=True).unlink(missing_ok=True)
    for leftover in folder.glob(f".rank-{rank}.*"):  # a write cut off there
        leftover.unlink(missing_ok=True)
    folder.rmdir()  # the last rank out removes it; the others fail here, as it is not empty yet


def load(
    directory: "str | os.PathLike[str]",
    *,
    comm: "Communicator | MPI.Comm | None" = None,
    trusted: bool = False,
    other_sizes: Literal["raise", "skip"] = "raise",
) -> tuple[int, Any] | None:
    """The newest complete version in ``directory`` and this rank's state of it; collective.

    ``None`` where there is none (a first run, or a missing folder). The ranks
    agree on the version: each finds the newest complete one it sees, and they
    take the oldest of those, which every rank must have. A rank's file is read
    and its checksum checked; loading it runs no code.

    Args:
        directory: the checkpoints' folder.
        comm: the communicator; the default one when ``None``.
        trusted: also read a version of the old format (``rank-<r>.pkl``, pickled),
            which RUNS CODE the file chooses as it loads: only for files you made
            or trust. Without it such a version raises, naming its file.
        other_sizes: where the newest checkpoint is of another world size (a
            relaunch with another ``-n``): ``"raise"`` (naming the sizes), or
            ``"skip"``: take the newest of this world size, ``None`` if none.

    Raises:
        CheckpointError: on every rank, when a rank lacks the agreed version or
            cannot read its file (damaged, cut short, not of this format, the old
            format without ``trusted``: naming the file), or the newest
            checkpoint is of another world size.
    """
    if other_sizes not in ("raise", "skip"):
        raise ConfigurationError(f"other_sizes must be 'raise' or 'skip', got {other_sizes!r}")
    group = communicator_of(comm)
    rank, size = group.rank, group.size
    root = Path(directory)
    damaged: dict[int, str] = {}
    found = _complete(root, damaged)

    def file_of(version: int, r: int) -> Path:
        return _rank_file(_folder(root, version), r, found.get(version, {}).get("format") == LEGACY_FORMAT)

    # a file there but not a regular one is this rank's to refuse when read, naming what it is
    mine = [v for v in sorted(found) if found[v]["size"] == size and kind_of(file_of(v, rank)) is not None]
    other = [v for v in sorted(found) if found[v]["size"] != size]
    # a version complete (its manifest written after every rank's file) yet without this rank's file
    for v in sorted(found):
        if found[v]["size"] == size and v not in mine:
            damaged[v] = f"{file_of(v, rank)} (missing)"
    newest_damaged = max(damaged, default=-1)
    row = [mine[-1] if mine else -1, other[-1] if other else -1, newest_damaged]
    rows = allgather(np.array(row, np.int64), comm=group).reshape(-1, 3)
    newest, others = rows[:, 0], rows[:, 1]
    bad = [r for r, (n, d) in enumerate(zip(newest, rows[:, 2], strict=True)) if d > n]
    if bad:  # loading the version before would be silently older: name what is damaged
        named = ", ".join(damaged[v] for v in sorted(damaged)) or ", ".join(
            f"rank {r}'s file or the manifest of {_folder(root, int(rows[r, 2]))}" for r in bad
        )
        raise CheckpointError(
            f"rank {rank}: a version newer than the newest whole one is damaged (a file missing or "
            f"unreadable): {named}"
        )
    if other_sizes == "raise" and any(o > n for n, o in zip(newest, others, strict=True)):
        raise CheckpointError(_other_size(root, rank, size, found, mine))
    if all(v < 0 for v in newest):
        return None
    version = int(min(newest))
    seen = ", ".join(f"rank {r}: {v if v >= 0 else 'none'}" for r, v in enumerate(newest))
    if version < 0:  # every rank knows it: all raise alike
        lacking = [r for r, v in enumerate(newest) if v < 0]
        raise CheckpointError(
            f"rank {rank}: rank{'s' if len(lacking) > 1 else ''} {', '.join(map(str, lacking))} "
            f"found no complete checkpoint in {root}, the others did (newest complete: {seen})"
        )
    error: BaseException | None = None
    state: Any = None
    try:
        if version not in mine:
            raise CheckpointError(f"rank {rank} lacks version {version} in {root} (newest complete: {seen})")
        manifest = found[version]
        owner = {"rank": rank, "version": version, "checkpoint": manifest.get("checkpoint")}
        files = manifest.get("files")
        state = _read(file_of(version, rank), trusted, owner, None if files is None else tuple(files[rank]))
    except Exception as failure:
        error = failure
    what = f"loading checkpoint version {version} from {root}"
    _agree_ok(group, error, what, lambda r: file_of(version, r))
    return version, state


def _other_size(root: Path, rank: int, size: int, found: dict[int, dict[str, Any]], mine: list[int]) -> str:
    """Why a load stops: the newest checkpoint is of another world size."""
    newer = {v: m["size"] for v, m in found.items() if m["size"] != size and (not mine or v > mine[-1])}
    if not newer:
        return f"rank {rank}: a rank found a newer checkpoint of another world size than {size} in {root}"
    newest = {s: max(v for v in newer if newer[v] == s) for s in sorted(set(newer.values()))}
    sizes = ", ".join(f"{s} (version {v})" for s, v in newest.items())
    ours = f"newest of size {size}: version {mine[-1]}" if mine else f"none of size {size}"
    return (
        f"rank {rank}: the newest checkpoint in {root} is of world size {sizes}, "
        f"this run has {size} ({ours}); relaunch with that size, or pass other_sizes='skip' "
        "to take the newest of this size"
    )


def _read(path: Path, trusted: bool, owner: dict[str, Any], digest: tuple[int, int] | None) -> Any:
    """This rank's state from its file ``path``: a state file, or the old pickled one if ``trusted``.

    A state file must name ``owner`` in its header and be of ``digest`` (the manifest's).
    """
    if path.suffix != ".pkl":
        return read_state(path, owner=owner, digest=digest)  # the arrays keep the bytes just read
    if not trusted:
        raise CheckpointError(
            f"{path}: a checkpoint of the old pickled format ({LEGACY_FORMAT}), which runs code as it "
            "loads; pass trusted=True only for files you trust"
        )
    try:
        with open(path, "rb") as file:
            data = bytearray(os.fstat(file.fileno()).st_size)
            file.readinto(data)
        return loads(data, copy=False)  # runs code: the caller said it trusts the file
    except Exception as error:
        raise CheckpointError(f"{path}: cannot read the old-format checkpoint ({error})") from error
