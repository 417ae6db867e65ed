"""Directory checkpoints on loopback ranks: atomic, one version across ranks, partial ones never loaded."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collectives import Communicator, ConfigurationError
from collectives.faults import arm, disarm
from collectives.resilience import CheckpointError, complete_versions, folder_of, load, save

from .conftest import run_ranks


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    disarm()
    yield
    disarm()


def _state(rank: int, version: int) -> dict[str, Any]:
    return {"rank": rank, "version": version, "w": np.arange(5.0) + 10 * rank + version}


def test_a_first_run_finds_nothing_and_later_ones_the_newest_complete_version(tmp_path: Path) -> None:
    def body(comm: Communicator) -> Any:
        first = load(tmp_path / "missing", comm=comm)
        for version in (2, 4, 6):
            save(tmp_path, _state(comm.rank, version), version, comm=comm)
        return first, load(tmp_path, comm=comm)

    for rank, (first, (version, state)) in enumerate(run_ranks(3, body)):
        assert first is None
        assert version == 6 and state["rank"] == rank
        np.testing.assert_array_equal(state["w"], _state(rank, 6)["w"])
    assert complete_versions(tmp_path) == [4, 6]  # keep=2: the oldest lost its files
    assert not folder_of(tmp_path, 2).exists()
    manifest = json.loads((folder_of(tmp_path, 6) / "manifest.json").read_text())
    files = [folder_of(tmp_path, 6) / f"rank-{r}.state" for r in range(3)]
    assert manifest == {
        "format": "collectives.resilience/3",
        "size": 3,
        "version": 6,
        "checkpoint": manifest["checkpoint"],
        "files": [[f.stat().st_size, int.from_bytes(f.read_bytes()[-4:], "little")] for f in files],
        "crc32": manifest["crc32"],
    }
    assert len(manifest["checkpoint"]) == 32


def test_a_write_cut_off_fails_every_rank_naming_it_and_the_version_before_is_loaded(tmp_path: Path) -> None:
    arm("1:checkpoint:1:raise")  # rank 1's second checkpoint write fails halfway

    def body(comm: Communicator) -> Any:
        save(tmp_path, _state(comm.rank, 1), 1, comm=comm)
        with pytest.raises(CheckpointError, match="failed on rank 1") as failed:
            save(tmp_path, _state(comm.rank, 2), 2, comm=comm)
        return str(failed.value), load(tmp_path, comm=comm)

    results = run_ranks(2, body)
    assert "injected fault 1:checkpoint:1:raise" in results[1][0]
    for rank, (_, (version, state)) in enumerate(results):
        assert version == 1 and state == {**state, "rank": rank, "version": 1}
    assert complete_versions(tmp_path) == [1]
    assert not (folder_of(tmp_path, 2) / "manifest.json").exists()
    assert not (folder_of(tmp_path, 2) / "rank-1.state").exists()


def test_a_version_without_its_manifest_or_of_another_world_size_is_not_loaded(tmp_path: Path) -> None:
    run_ranks(2, lambda comm: save(tmp_path, _state(comm.rank, 3), 3, comm=comm))
    run_ranks(3, lambda comm: save(tmp_path, _state(comm.rank, 5), 5, comm=comm))
    killed = folder_of(tmp_path, 7)  # every rank's file, but the manifest never came
    killed.mkdir()
    for rank in range(2):
        (killed / f"rank-{rank}.state").write_bytes(b"partial")
    found = run_ranks(2, lambda comm: load(tmp_path, comm=comm, other_sizes="skip"))
    assert [version for version, _ in found] == [3, 3]
    assert complete_versions(tmp_path, 3) == [5]


def test_a_rank_missing_the_agreed_version_fails_every_rank(tmp_path: Path) -> None:
    run_ranks(2, lambda comm: save(tmp_path, _state(comm.rank, 1), 1, comm=comm))
    (folder_of(tmp_path, 1) / "rank-1.state").unlink()

    def body(comm: Communicator) -> str:
        with pytest.raises(CheckpointError, match="is damaged") as failed:
            load(tmp_path, comm=comm)
        return str(failed.value)

    # rank 1's file of a complete version is gone: named on every rank, not taken for "no checkpoint"
    assert all("rank 1" in text and "v00000001" in text for text in run_ranks(2, body))


def test_bad_versions_and_keeps_are_named(tmp_path: Path) -> None:
    def body(comm: Communicator) -> None:
        with pytest.raises(ConfigurationError, match="version"):
            save(tmp_path, 0, -1, comm=comm)
        with pytest.raises(ConfigurationError, match="keep"):
            save(tmp_path, 0, 1, comm=comm, keep=0)

    run_ranks(1, body)


def test_training_state_round_trips_model_optimizer_and_step(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch helpers need torch (pip install torch==2.13.0)")
    from collectives.torch_integration import load_training, save_training

    def make() -> tuple[Any, Any]:
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 3)
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def step(net: Any, optimizer: Any, i: int) -> None:
        optimizer.zero_grad()
        net(torch.full((2, 4), float(i))).square().sum().backward()
        optimizer.step()

    def body(comm: Communicator) -> tuple[list[Any], list[Any]]:
        net, optimizer = make()
        assert load_training(tmp_path, net, optimizer, comm=comm) is None
        for i in range(2):
            step(net, optimizer, i)
        save_training(tmp_path, 2, net, optimizer, comm=comm)
        for i in range(2, 4):
            step(net, optimizer, i)
        fresh, fresh_optimizer = make()
        assert load_training(tmp_path, fresh, fresh_optimizer, comm=comm) == 2
        for i in range(2, 4):
            step(fresh, fresh_optimizer, i)
        return [p.detach() for p in net.parameters()], [p.detach() for p in fresh.parameters()]

    for straight, resumed in run_ranks(2, body):
        for a, b in zip(straight, resumed, strict=True):
            assert torch.equal(a, b)  # bitwise: the momentum came back too


def test_a_training_checkpoints_store_folder_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch helpers need torch (pip install torch==2.13.0)")
    from collectives.torch_integration import load_training, save_training
    from tests.test_kvstore import run_store

    outside = tmp_path / "outside"
    (outside / "v00000003").mkdir(parents=True)
    (outside / "marker").write_text("untouched")
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    checkpoints = tmp_path / "checkpoints"

    def body(kv: Any, comm: Communicator) -> list[str]:
        net = torch.nn.Linear(2, 2)
        kv.init("w", np.zeros(4, np.float32))
        save_training(checkpoints, 2, net, comm=comm, kv=kv)
        store = folder_of(checkpoints, 2) / "kvstore"  # a link planted where the store's folder is read
        store.rename(tmp_path / "moved")
        store.symlink_to(outside)
        errors = []
        try:
            load_training(checkpoints, torch.nn.Linear(2, 2), comm=comm, kv=kv)
        except CheckpointError as error:
            errors.append(str(error))
        return errors

    for errors in run_store(1, body):
        assert errors and "symbolic link" in errors[0] and "kvstore" in errors[0], errors
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
    assert (outside / "marker").read_text() == "untouched"
