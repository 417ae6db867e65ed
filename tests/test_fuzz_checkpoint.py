"""Random damage to saved checkpoints of both kinds: every load equals the saved state or names a file."""

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collectives import Communicator, KVStoreError
from collectives.errors import CheckpointError
from collectives.resilience import load, save

from .conftest import run_ranks
from .mpirun import mpiexec, run_mpi
from .test_checkpoint_files import _same
from .test_kvstore import run_store

# $COLLECTIVES_FUZZ_SEED tries other sequences; CI runs this fixed one
SEED = int(os.environ.get("COLLECTIVES_FUZZ_SEED", "20261126"))


def _damage(rng: random.Random, files: list[Path]) -> Path:
    """One random kind of damage to one of ``files``; the file damaged."""
    path = rng.choice(files)
    data = bytearray(path.read_bytes())
    how = rng.choice(["flip", "flip", "truncate", "remove", "append", "field"])
    if how == "remove" or not data:
        path.unlink()
    elif how == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    elif how == "truncate":
        path.write_bytes(bytes(data[: rng.randrange(len(data))]))
    elif how == "append":
        path.write_bytes(bytes(data) + b"\x00" * rng.randint(1, 64))
    elif path.name == "manifest.json":  # a field of the manifest given another value
        manifest = json.loads(data)
        field = rng.choice(sorted(manifest))
        manifest[field] = rng.choice([None, 0, -1, 3, "x", [], {}, 1.5])
        path.write_text(json.dumps(manifest))
    else:
        data[rng.randrange(min(len(data), 200))] ^= 0xFF  # the header's bytes
        path.write_bytes(bytes(data))
    return path


def _states(rank: int) -> dict[int, Any]:
    return {v: {"rank": rank, "v": v, "w": np.arange(50.0) * v + rank, "t": (v, "x")} for v in (1, 2)}


def test_a_damaged_directory_checkpoint_loads_as_saved_or_raises_naming_a_file(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    template = tmp_path / "template"
    for v in (1, 2):
        run_ranks(2, lambda comm, v=v: save(template, _states(comm.rank)[v], v, comm=comm))
    files = sorted(p.relative_to(template) for p in template.rglob("*") if p.is_file())
    for trial in range(40):
        root = tmp_path / f"t{trial}"
        shutil.copytree(template, root)
        damaged = _damage(rng, [root / f for f in files])

        def body(comm: Communicator, root: Path = root) -> Any:
            try:
                return load(root, comm=comm)
            except CheckpointError as error:
                return error

        for rank, outcome in enumerate(run_ranks(2, body)):
            if isinstance(outcome, CheckpointError):
                assert str(root) in str(outcome), (trial, damaged, outcome)
                continue
            # a version whose manifest is gone is no version: the one before it (or none) is loaded
            assert outcome is not None or damaged.name == "manifest.json", (trial, damaged)
            if outcome is not None:
                version, state = outcome
                assert _same(state, _states(rank)[version]), (trial, damaged, version)
                assert version == 2 or damaged.name == "manifest.json", (trial, damaged, version)


def test_a_damaged_store_checkpoint_loads_as_saved_or_raises_naming_a_file(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    template = tmp_path / "template"
    values = {"w": np.arange(40.0) / 3, 7: np.arange(6, dtype=np.float32).reshape(2, 3)}

    def saving(kv: Any, comm: Communicator) -> None:
        for key, value in values.items():
            kv.init(key, value)
        kv.save(template)

    run_store(2, saving, mode="async")
    files = sorted(template.iterdir())
    for trial in range(25):
        root = tmp_path / f"t{trial}"
        shutil.copytree(template, root)
        damaged = _damage(rng, [root / f.name for f in files])

        def loading(kv: Any, comm: Communicator, root: Path = root) -> Any:
            try:
                kv.load(root)
            except KVStoreError as error:
                return error
            return {key: kv.pull(key).copy() for key in values}

        for outcome in run_store(2, loading, mode="async"):
            if isinstance(outcome, KVStoreError):
                assert str(root) in str(outcome), (trial, damaged, outcome)
            else:
                assert all(_same(outcome[k], values[k]) for k in values), (trial, damaged)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("how", ["flip", "pickle"])
def test_a_file_damaged_or_crafted_on_one_rank_raises_on_every_rank_under_mpiexec(
    tmp_path: Path, how: str
) -> None:
    try:
        result = run_mpi(2, ["-m", "tests.faults.damaged_checkpoint", str(tmp_path), how], timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the load hung:\n{expired.output}")
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout
    assert not (tmp_path / "pwned").exists()
