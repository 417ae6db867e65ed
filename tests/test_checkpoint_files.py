"""Checkpoint files (issue 30, items 1 and 2): loading runs no code, damage is named, never silent."""

import json
import os
import pickle
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from collectives import Communicator, KVStoreError
from collectives.errors import CheckpointError
from collectives.files import check_json, dump_json, read_state, state_pieces
from collectives.resilience import folder_of, load, save
from collectives.resilience.serial import pieces

from .conftest import run_ranks
from .test_kvstore import run_store


class _Marker:
    """Unpickling it creates the file it names: the crafted payload a hostile checkpoint carries."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.makedirs, (str(self.path),))


def _write_old_format(root: Path, state_of: Any, size: int, version: int = 1) -> Path:
    """A checkpoint as today's code before this fix wrote it: pickled rank files, a format-1 manifest."""
    folder = folder_of(root, version)
    folder.mkdir(parents=True)
    for rank in range(size):
        (folder / f"rank-{rank}.pkl").write_bytes(b"".join(bytes(p) for p in pieces(state_of(rank))))
    manifest = {"format": "collectives.resilience/1", "size": size, "version": version}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_crafted_pickle_never_runs_and_the_error_names_the_file(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = _write_old_format(tmp_path / "ckpt", lambda rank: {"w": np.ones(3), "evil": _Marker(marker)}, 2)

    def body(comm: Communicator) -> str:
        with pytest.raises(CheckpointError) as caught:
            load(tmp_path / "ckpt", comm=comm)
        return str(caught.value)

    for text in run_ranks(2, body):
        assert "trusted=True" in text and str(folder / "rank-") in text, text
    assert not marker.exists()
    # a pickle under the new name is no state file either, and is not unpickled
    (folder / "rank-0.state").write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(CheckpointError, match=r"rank-0\.state: not a state file"):
        read_state(folder / "rank-0.state")
    assert not marker.exists()


def test_an_old_checkpoint_loads_only_when_trusted(tmp_path: Path) -> None:
    _write_old_format(tmp_path, lambda rank: {"rank": rank, "w": np.arange(4.0)}, 2, version=3)
    found = run_ranks(2, lambda comm: load(tmp_path, comm=comm, trusted=True))
    assert [(v, s["rank"]) for v, s in found] == [(3, 0), (3, 1)]
    np.testing.assert_array_equal(found[1][1]["w"], np.arange(4.0))


def test_one_flipped_bit_is_named_on_every_rank(tmp_path: Path) -> None:
    run_ranks(2, lambda comm: save(tmp_path, {"w": np.arange(100.0) + comm.rank}, 1, comm=comm))
    path = folder_of(tmp_path, 1) / "rank-1.state"
    data = bytearray(path.read_bytes())
    data[len(data) - 300] ^= 0x04  # a bit of the array's bytes
    path.write_bytes(bytes(data))

    def body(comm: Communicator) -> str:
        with pytest.raises(CheckpointError) as caught:
            load(tmp_path, comm=comm)
        return str(caught.value)

    zero, one = run_ranks(2, body)
    assert "checksum mismatch" in one and str(path) in one
    assert "failed on rank 1" in zero and str(path) in zero


def test_another_world_size_is_named_unless_skipped(tmp_path: Path) -> None:
    run_ranks(3, lambda comm: save(tmp_path, {"rank": comm.rank}, 5, comm=comm))

    def body(comm: Communicator) -> tuple[str, Any]:
        with pytest.raises(CheckpointError) as caught:
            load(tmp_path, comm=comm)
        return str(caught.value), load(tmp_path, comm=comm, other_sizes="skip")

    for text, skipped in run_ranks(2, body):
        assert "world size 3 (version 5), this run has 2" in text and "other_sizes='skip'" in text
        assert skipped is None


def test_a_value_outside_the_allow_list_is_named_where_it_is(tmp_path: Path) -> None:
    class Sampler:
        pass

    def body(comm: Communicator) -> str:
        with pytest.raises(CheckpointError) as caught:
            save(tmp_path, {"step": 1, "extra": {"sampler": Sampler()}}, 1, comm=comm)
        return str(caught.value)

    text = run_ranks(1, body)[0]
    assert "state['extra']['sampler']: type" in text and "Sampler" in text and "numpy arrays" in text
    with pytest.raises(CheckpointError, match=r"state\[0\]: dtype object"):
        state_pieces([np.array([1, "a"], object)])


def _allowed() -> Any:
    ordered: Any = OrderedDict(a=np.arange(3, dtype=np.int16))
    ordered._metadata = {"": {"version": 1}}
    return {
        "none": None, "flags": [True, False], 7: -(2**70), (1, "k"): 2.5, "nan": float("nan"),
        "inf": (float("inf"), -0.0), "text": "é\u2603", "raw": b"\x00\xff", "ordered": ordered,
        "bf16": np.arange(5).astype(ml_dtypes.bfloat16), "scalar": np.float32(1.5), "zero_d": np.array(3),
        "empty": np.zeros((0, 4)), "strided": np.arange(12.0).reshape(3, 4)[:, ::2],
        "complex": np.array([1 + 2j]), "strings": np.array(["ab", "c"]), "none_key": {None: 1},
    }  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a.hex() == b.hex()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        same = list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
        return same and getattr(a, "_metadata", None) == getattr(b, "_metadata", None)
    return bool(a == b)


def test_every_allowed_value_round_trips_exactly(tmp_path: Path) -> None:
    state = _allowed()
    run_ranks(1, lambda comm: save(tmp_path, state, 1, comm=comm))
    version, back = run_ranks(1, lambda comm: load(tmp_path, comm=comm))[0]
    assert version == 1 and _same(back, state)
    assert back["bf16"].dtype == np.dtype(ml_dtypes.bfloat16) and back["zero_d"].shape == ()


def test_torch_tensors_and_state_dicts_round_trip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch tensors need torch (pip install torch==2.13.0)")
    import collectives.torch_integration  # noqa: F401  (registers the tensors' codec)

    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).to(torch.bfloat16)
    state = {"model": net.state_dict(), "t": torch.arange(6).reshape(2, 3).T, "e": torch.empty(0, 2)}
    run_ranks(1, lambda comm: save(tmp_path, state, 1, comm=comm))
    _, back = run_ranks(1, lambda comm: load(tmp_path, comm=comm))[0]
    assert back["model"]._metadata == state["model"]._metadata
    for name, tensor in state["model"].items():
        assert back["model"][name].dtype == tensor.dtype and torch.equal(back["model"][name], tensor)
    assert torch.equal(back["t"], state["t"]) and back["e"].shape == (0, 2)
    net.load_state_dict(back["model"])


# -- the store's checkpoints ------------------------------------------------------------------------


def _store_checkpoint(root: Path) -> Path:
    def body(kv: Any, comm: Communicator) -> None:
        kv.init("w", np.arange(40.0))
        kv.init(3, np.arange(6, dtype=np.float32).reshape(2, 3))
        kv.push("w", np.ones(40))
        kv.save(root)

    run_store(2, body, mode="async")
    return root


def _load_store(directory: Path) -> list[Any]:
    """Each worker's values after loading ``directory``, or the KVStoreError it raised."""

    def body(kv: Any, comm: Communicator) -> Any:
        try:
            kv.load(directory)
        except KVStoreError as error:
            return error
        return {"w": kv.pull("w").copy(), 3: kv.pull(3).copy()}

    return run_store(2, body, mode="async")


def _edit_manifest(directory: Path, edit: Any) -> None:
    """Edit the manifest and write it with a matching checksum: as a tool could, not as damage."""
    path = directory / "manifest.json"
    manifest = check_json(json.loads(path.read_text()), str(path))
    edit(manifest)
    path.write_bytes(dump_json(manifest))


def _key(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    return next(entry for entry in manifest["keys"] if entry["key"] == key)


MANIFEST_EDITS = {
    "one server more": lambda m: m.update(servers=3),
    "one server less": lambda m: m.update(servers=1),
    "an extra key": lambda m: m["keys"].append({**_key(m, "sw"), "key": "sx"}),
    "a larger shape": lambda m: _key(m, "sw").update(shape=[80]),
    "swapped bounds": lambda m: _key(m, "sw").update(bounds=_key(m, "sw")["bounds"][::-1]),
    "another dtype": lambda m: _key(m, "sw").update(dtype="float32"),
    "a missing field": lambda m: m.pop("keys"),
    "a wrong type": lambda m: m.update(clock="7"),
    "a bad dtype": lambda m: _key(m, "i3").update(dtype="object"),
    "a bad optimizer": lambda m: m.update(optimizer='{"name": "sgd", "evil": 1}'),
    "an optimizer of another type": lambda m: m.update(optimizer=["sgd"]),
}


@pytest.mark.parametrize("edit", sorted(MANIFEST_EDITS))
def test_a_tampered_store_manifest_is_refused_naming_the_file(tmp_path: Path, edit: str) -> None:
    directory = _store_checkpoint(tmp_path / "kv")
    _edit_manifest(directory, MANIFEST_EDITS[edit])
    for outcome in _load_store(directory):
        assert isinstance(outcome, KVStoreError), (edit, outcome)
        assert "manifest.json" in str(outcome) or "shard-" in str(outcome), (edit, str(outcome))


@pytest.mark.parametrize("damage", ["truncated", "empty", "flipped"])
def test_a_damaged_shard_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    directory = _store_checkpoint(tmp_path / "kv")
    shard = directory / "shard-1.state"
    data = bytearray(shard.read_bytes())
    if damage == "flipped":
        data[-20] ^= 1
    shard.write_bytes(bytes({"truncated": data[: len(data) // 2], "empty": b"", "flipped": data}[damage]))
    outcomes = _load_store(directory)
    assert all(isinstance(outcome, KVStoreError) for outcome in outcomes), outcomes
    assert "shard-1.state" in str(outcomes[0]), str(outcomes[0])


def _to_format_1(directory: Path) -> None:
    """Rewrite a store checkpoint as the format before state files: .npz shards, no checksums."""
    manifest = check_json(json.loads((directory / "manifest.json").read_text()), "manifest")
    for index in range(manifest["servers"]):
        shard = directory / f"shard-{index}.state"
        tree = read_state(shard)
        arrays: dict[str, np.ndarray] = {}
        for part in tree["parts"]:
            arrays[name := f"a{len(arrays)}"] = part["value"]
            part["value"] = name
            for field, value in list(part["state"].items()):
                if isinstance(value, np.ndarray):
                    arrays[name := f"a{len(arrays)}"] = value
                    part["state"][field] = {"array": name}
                else:
                    part["state"][field] = {"scalar": value}
        np.savez(directory / f"shard-{index}.npz", meta=np.array(json.dumps(tree)), **arrays)
        shard.unlink()
    (directory / "manifest.json").write_text(json.dumps({**manifest, "format": "collectives.kvstore/1"}))


def test_a_store_checkpoint_of_format_1_still_loads_and_is_checked_alike(tmp_path: Path) -> None:
    directory = _store_checkpoint(tmp_path / "kv")
    expected = _load_store(directory)
    _to_format_1(directory)
    for got, want in zip(_load_store(directory), expected, strict=True):
        assert not isinstance(got, Exception), got
        assert all(_same(got[k], want[k]) for k in want)
    text = (directory / "manifest.json").read_text()
    manifest = json.loads(text)
    _key(manifest, "sw").update(shape=[80])
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert "shard-0.npz" in str(_load_store(directory)[0])  # shard 0 holds 'sw', of another shape
    (directory / "manifest.json").write_text(text)
    (directory / "shard-1.npz").write_bytes(b"")
    assert "shard-1.npz" in str(_load_store(directory)[0])


def _craft(header: Any, data: bytes = b"") -> bytes:
    """A state file of ``header`` and ``data``, checksum right (the layout docs/fault_tolerance.md gives)."""
    text = json.dumps(header).encode()
    head = b"CLSTATE\x00" + len(text).to_bytes(8, "little") + text
    head += bytes(-len(head) % 64)
    body = head + data
    return body + b"CLS\x00" + zlib.crc32(body).to_bytes(4, "little")


def _header(tree: Any, buffers: Any = (), size: int = 0) -> dict[str, Any]:
    return {
        "format": "collectives.state/2",
        "owner": None,
        "size": size,
        "buffers": list(buffers),
        "tree": tree,
    }


CRAFTED = {
    "an object dtype": (
        _header({"t": "a", "dtype": "|O", "shape": [1], "b": 0}, [[0, 8]], 8),
        "holds Python",
    ),
    "a shape too large": (
        _header({"t": "a", "dtype": "<f8", "shape": [2**40, 2**40], "b": 0}, [[0, 8]], 8),
        "counts more than",
    ),
    "a shape larger than its buffer": (
        _header({"t": "a", "dtype": "<f8", "shape": [2, 3], "b": 0}, [[0, 8]], 8),
        r"\(2, 3\) in a buffer of 8",
    ),
    "a buffer out of range": (
        _header({"t": "a", "dtype": "<f8", "shape": [1], "b": 3}, [[0, 8]], 8),
        "names buffer 3",
    ),
    "an offset past the data": (_header({"t": "b", "b": 0}, [[4, 8]], 8), "runs past"),
    "an unknown tag": (_header({"t": "pickle", "v": "cos\nsystem\n"}), "unknown tag"),
    "no tree": ({"format": "collectives.state/2", "owner": None, "size": 0, "buffers": []}, "lacks"),
    "a wrong size": (_header(None, [], 64), "cut short"),
    "an untagged list": (_header(json.loads("[" * 50 + "]" * 50)), "not a tagged value"),
    "an unknown codec": (
        _header({"t": "x", "codec": "os.system", "fields": {}, "b": 0}, [[0, 0]]),
        "not registered",
    ),
    "a field of the wrong type": (_header({"t": "l", "v": 3}), "malformed"),
    "an unhashable key": (_header({"t": "d", "k": [{"t": "l", "v": []}], "v": [1]}), "mapping key"),
    "another format": ({"format": "pickle/5"}, "format 'pickle/5'"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_header_raises_naming_the_file_and_what_is_wrong(tmp_path: Path, case: str) -> None:
    header, why = CRAFTED[case]
    data = (
        bytes(header.get("size", 0))
        if isinstance(header.get("size"), int) and case != "a wrong size"
        else b""
    )
    path = tmp_path / "rank-0.state"
    path.write_bytes(_craft(header, data))
    with pytest.raises(CheckpointError, match=why) as caught:
        read_state(path)
    assert str(path) in str(caught.value)


def test_a_header_nested_past_the_recursion_limit_raises_naming_the_file(tmp_path: Path) -> None:
    deep = '{"t":"l","v":[' * 100_000 + "]}" * 100_000
    text = (
        '{"format":"collectives.state/2","owner":null,"size":0,"buffers":[],"tree":' + deep + "}"
    ).encode()
    head = b"CLSTATE\x00" + len(text).to_bytes(8, "little") + text
    body = head + bytes(-len(head) % 64)
    path = tmp_path / "rank-0.state"
    path.write_bytes(body + b"CLS\x00" + zlib.crc32(body).to_bytes(4, "little"))
    with pytest.raises(CheckpointError, match=r"not JSON|nested too deep") as caught:
        read_state(path)
    assert str(path) in str(caught.value)


def test_a_wrong_trailer_magic_is_named_not_called_a_checksum_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.state"
    data = bytearray(b"".join(bytes(p) for p in state_pieces({"w": np.arange(3.0)})))
    data[-8:-4] = b"XYZ\x00"  # the CRC stays right: only the magic is wrong
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as caught:
        read_state(path)
    text = str(caught.value)
    assert str(path) in text and "trailer" in text and "XYZ" in text and "checksum" not in text, text


def test_a_save_or_load_on_a_closed_store_says_so(tmp_path: Path) -> None:
    def body(kv: Any, comm: Communicator) -> list[str]:
        kv.init("w", np.arange(4.0))
        kv.close()
        texts = []
        for what in ("save", "load"):
            with pytest.raises(KVStoreError) as caught:
                getattr(kv, what)(tmp_path / "kv")
            texts.append(str(caught.value))
        return texts

    for rank, texts in enumerate(run_store(2, body, mode="async")):
        assert texts == [
            f"save: the store is closed on rank {rank}",
            f"load: the store is closed on rank {rank}",
        ]
    assert not (tmp_path / "kv").exists()
