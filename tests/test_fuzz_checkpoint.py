"""Damaged and crafted checkpoints of both kinds: every load equals the saved state or names a file."""

import contextlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collectives import Communicator, KVStoreError, barrier
from collectives.errors import CheckpointError
from collectives.files import check_json, dump_json, read_outline, read_state, state_pieces
from collectives.resilience import complete_versions, folder_of, load, save

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


# -- crafted files: each refused at once, naming the file; nothing outside the folder changes -------

HANG_GUARD_S = (
    5.0  # refusals take milliseconds; this only turns a hang (a FIFO, a quadratic header) into a failure
)


def _snapshot(folder: Path) -> dict[str, Any]:
    """Every entry under ``folder``, no link followed: its kind, and a file's bytes or a link's target."""
    found: dict[str, Any] = {}
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(parent) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[str(path.relative_to(folder))] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                found[str(path.relative_to(folder))] = ("file", path.read_bytes())
            else:
                found[str(path.relative_to(folder))] = ("other", stat.S_IFMT(mode))
    return found


def _outside(tmp_path: Path) -> Path:
    """A folder beside the checkpoints that nothing may change: a file, and a folder holding one."""
    outside = tmp_path / "outside"
    (outside / "kept").mkdir(parents=True)
    (outside / "precious.txt").write_text("not the checkpoint's")
    (outside / "kept" / "inner.txt").write_text("nor this")
    return outside


def _bounded(call: Callable[[], Any], fifos: Sequence[Path] = ()) -> tuple[Any, float]:
    """``call()``'s result (or what it raised) and its seconds; fails if it runs past the hang guard.

    A reader stuck opening one of ``fifos`` is let go (a writer opens it) so the thread ends.
    """
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # the outcome is what is tested
            outcome.append(error)

    start = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    took = time.perf_counter() - start
    if thread.is_alive():
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(60)
        pytest.fail(f"still running after {HANG_GUARD_S} s (a hang)")
    return outcome[0], took


def _split(path: Path) -> tuple[dict[str, Any], bytes]:
    """A state file's header and its data (the bytes between the header's padding and the trailer)."""
    data = path.read_bytes()
    length = int.from_bytes(data[8:16], "little")
    start = 16 + length
    return json.loads(data[16:start]), data[start + (-start % 64) : -8]


def _write_state(path: Path, header_text: str, body: bytes) -> None:
    """A state file of ``header_text`` and ``body``, its checksum right: as an attacker writes one."""
    text = header_text.encode()
    head = b"CLSTATE\x00" + len(text).to_bytes(8, "little") + text
    whole = head + bytes(-len(head) % 64) + body
    path.write_bytes(whole + b"CLS\x00" + zlib.crc32(whole).to_bytes(4, "little"))


def _rewrite(path: Path, edit: Callable[[dict[str, Any]], Any], text: Callable[[str], str] = str) -> None:
    """Give the state file ``path`` the header ``edit`` makes of its own (then ``text`` of its JSON)."""
    header, body = _split(path)
    edit(header)
    _write_state(path, text(json.dumps(header)), body)


def _relist(folder: Path) -> None:
    """Make the manifest list its rank files' lengths and checksums as they are now (where it lists any)."""
    path = folder / "manifest.json"
    manifest = check_json(json.loads(path.read_text()), str(path))
    if "files" in manifest:
        files = [folder / f"rank-{r}.state" for r in range(manifest["size"])]
        manifest["files"] = [[f.stat().st_size, int.from_bytes(f.read_bytes()[-4:], "little")] for f in files]
    path.write_bytes(dump_json(manifest))


def _edit_json(path: Path, text: Callable[[str], str]) -> None:
    path.write_text(text(path.read_text()))


def _tree_entry(header: dict[str, Any], key: str) -> dict[str, Any]:
    """The tree node of ``key`` in a state file's header of a dict."""
    tree = header["tree"]
    return tree["v"][tree["k"].index(key)]  # type: ignore[no-any-return]


def _second_save(tmp_path: Path, version: int) -> Path:
    """The folder of ``version`` of another save (other values), made aside."""
    aside = tmp_path / "aside"
    run_ranks(2, lambda comm: save(aside, _states(comm.rank)[1], version, comm=comm))
    return folder_of(aside, version)


def _link_out(root: Path, outside: Path, name: str) -> Path:
    """``name`` in version 2 made a link to a copy of itself outside the folder; the link."""
    path = folder_of(root, 2) / name
    shutil.copy(path, outside / name)
    path.unlink()
    path.symlink_to(outside / name)
    return path


def _fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def _version_linked_out(tmp_path: Path, root: Path, outside: Path) -> Path:
    """Version 3 of another save, moved outside, and a link to it as the newest version."""
    shutil.move(_second_save(tmp_path, 3), outside / "v3")
    folder_of(root, 3).symlink_to(outside / "v3")
    return folder_of(root, 3)


def _overlap(header: dict[str, Any]) -> None:
    offset = header["buffers"][0][0]
    header["buffers"].append([offset + 8, 8])  # the array's second element, also a bytes value
    _tree_entry(header, "t")["v"][1] = {"t": "b", "b": 1}


def _shared(header: dict[str, Any]) -> None:
    _tree_entry(header, "t")["v"][1] = {**_tree_entry(header, "w")}  # a second array on the first's buffer


def _rank_file(root: Path, rank: int = 1, version: int = 2) -> Path:
    return folder_of(root, version) / f"rank-{rank}.state"


DIRECTORY_ATTACKS: dict[str, tuple[Callable[[Path, Path, Path], Path], str]] = {
    # name: (attack(tmp_path, root, outside) -> the path an error must name, what the error says)
    "rank 1's file replaced by rank 0's": (
        lambda t, root, o: Path(shutil.copy(_rank_file(root, 0), _rank_file(root))),
        "header says rank 0",
    ),
    "rank 1's file replaced by its previous version's": (
        lambda t, root, o: Path(shutil.copy(_rank_file(root, 1, 1), _rank_file(root))),
        "header says version 1",
    ),
    "rank 1's file replaced by another save's of the same version": (
        lambda t, root, o: Path(shutil.copy(_second_save(t, 2) / "rank-1.state", _rank_file(root))),
        "checkpoint",
    ),
    "rank 1's file a link to rank 0's, in the folder": (
        lambda t, root, o: (
            (_rank_file(root).unlink(), _rank_file(root).symlink_to("rank-0.state")) and _rank_file(root)
        ),
        "symbolic link",
    ),
    "rank 1's file a link out of the folder": (
        lambda t, root, o: _link_out(root, o, "rank-1.state"),
        "symbolic link",
    ),
    "the manifest a link out of the folder": (
        lambda t, root, o: _link_out(root, o, "manifest.json"),
        "symbolic link",
    ),
    "the newest version a link out of the folder": (_version_linked_out, "symbolic link"),
    "rank 1's file a FIFO": (lambda t, root, o: _fifo(_rank_file(root)), "FIFO"),
    "the manifest a FIFO": (lambda t, root, o: _fifo(folder_of(root, 2) / "manifest.json"), "FIFO"),
    "a key twice in the manifest": (
        lambda t, root, o: (
            _edit_json(folder_of(root, 2) / "manifest.json", lambda s: s.replace("{", '{"size": 9,', 1))
            or folder_of(root, 2) / "manifest.json"
        ),
        "key 'size' twice",
    ),
}
# crafted headers of rank 1's file (the manifest made to list it, as an attacker would)
HEADER_ATTACKS: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[str], str], str]] = {
    "a shape of 100,000 dimensions of 2**62": (
        lambda h: _tree_entry(h, "w").update(shape=[2**62] * 100_000),
        str,
        "100000 dimensions",
    ),
    "a shape of 65 dimensions": (
        lambda h: _tree_entry(h, "w").update(shape=[50] + [1] * 64),
        str,
        "65 dimensions",
    ),
    "overlapping buffers": (_overlap, str, "overlaps buffer 0"),
    "two arrays on one buffer": (_shared, str, "two values name buffer 0"),
    "a key twice in the header": (
        lambda h: None,
        lambda s: s.replace("{", '{"tree": null, ', 1),
        "key 'tree' twice",
    ),
    "a key twice in a mapping": (lambda h: h["tree"]["k"].__setitem__(1, "rank"), str, "key 'rank' twice"),
}


def _saved(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    for v in (1, 2):
        run_ranks(2, lambda comm, v=v: save(root, _states(comm.rank)[v], v, comm=comm))
    return root


def _load_refused(tmp_path: Path, named: Path, why: str, fifos: Sequence[Path] = ()) -> None:
    """Loading the checkpoint in ``tmp_path`` raises on both ranks, naming ``named``, at once."""
    root, outside = tmp_path / "ckpt", tmp_path / "outside"
    before = _snapshot(outside)

    def body(comm: Communicator) -> Any:
        try:
            return load(root, comm=comm)
        except CheckpointError as error:
            return error

    outcomes, took = _bounded(lambda: run_ranks(2, body), fifos)
    assert not isinstance(outcomes, BaseException), outcomes
    assert all(isinstance(o, CheckpointError) for o in outcomes), outcomes
    texts = [str(o) for o in outcomes]
    assert all(str(named) in text and len(text) < 2000 for text in texts), texts
    assert any(re.search(why, text) for text in texts), texts
    assert _snapshot(outside) == before
    assert took < HANG_GUARD_S


@pytest.mark.parametrize("attack", sorted(DIRECTORY_ATTACKS))
def test_a_misplaced_linked_or_special_file_is_refused_naming_it(tmp_path: Path, attack: str) -> None:
    root, outside = _saved(tmp_path), _outside(tmp_path)
    make, why = DIRECTORY_ATTACKS[attack]
    named = make(tmp_path, root, outside)
    _load_refused(tmp_path, named, why, [named])


@pytest.mark.parametrize("attack", sorted(HEADER_ATTACKS))
def test_a_crafted_header_of_a_rank_file_is_refused_at_once_naming_the_file(
    tmp_path: Path, attack: str
) -> None:
    root = _saved(tmp_path)
    _outside(tmp_path)
    edit, text, why = HEADER_ATTACKS[attack]
    _rewrite(_rank_file(root), edit, text)
    _relist(folder_of(root, 2))
    _load_refused(tmp_path, _rank_file(root), why)


def test_pruning_removes_a_version_linked_out_of_the_folder_and_nothing_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "ckpt", _outside(tmp_path)
    run_ranks(2, lambda comm: save(outside / "looks_like_a_version", _states(comm.rank)[1], 1, comm=comm))
    target = folder_of(outside / "looks_like_a_version", 1)
    (target / "kvstore").mkdir()
    (target / "kvstore" / "shard-0.state").write_text("a store's shard")
    root.mkdir()
    folder_of(root, 1).symlink_to(target)  # an older version, complete as far as its target goes
    before = _snapshot(outside)

    def body(comm: Communicator) -> Any:
        for v in (2, 3):
            save(root, _states(comm.rank)[1], v, comm=comm, keep=1)
        barrier(comm=comm)  # the older versions are pruned by one rank, which may end its save later
        return complete_versions(root)

    assert run_ranks(2, body) == [[3], [3]]
    assert _snapshot(outside) == before
    assert not os.path.lexists(folder_of(root, 1))  # the link alone was removed


def test_a_save_into_a_version_folder_linked_out_is_refused_and_writes_nothing_there(tmp_path: Path) -> None:
    root, outside = tmp_path / "ckpt", _outside(tmp_path)
    root.mkdir()
    folder_of(root, 4).symlink_to(outside)
    before = _snapshot(outside)

    def body(comm: Communicator) -> Any:
        try:
            return save(root, _states(comm.rank)[1], 4, comm=comm)
        except CheckpointError as error:
            return error

    outcomes = run_ranks(2, body)
    assert all(isinstance(o, CheckpointError) and str(folder_of(root, 4)) in str(o) for o in outcomes), (
        outcomes
    )
    assert _snapshot(outside) == before


def _store_saved(tmp_path: Path) -> Path:
    root = tmp_path / "kv"
    values = {"w": np.arange(40.0) / 3, 7: np.arange(6, dtype=np.float32).reshape(2, 3)}

    def saving(kv: Any, comm: Communicator) -> None:
        for key, value in values.items():
            kv.init(key, value)
        kv.save(root)

    run_store(2, saving, mode="async")
    return root


def _huge_key(root: Path) -> Path:
    """Key 'sw' claimed of 10**13 elements in the manifest and its shards' headers; the last part's shard."""
    manifest_path = root / "manifest.json"
    manifest = check_json(json.loads(manifest_path.read_text()), "manifest")
    entry = next(e for e in manifest["keys"] if e["key"] == "sw")
    entry["shape"] = [10**13]
    manifest_path.write_bytes(dump_json(manifest))
    last = len(entry["bounds"]) - 1
    named = root

    def edit(header: dict[str, Any]) -> None:
        nonlocal named
        for part in _tree_entry(header, "parts")["v"]:
            fields = dict(zip(part["k"], part["v"], strict=True))
            if fields["key"] == "sw":
                part["v"][part["k"].index("shape")] = f"float64|{10**13}"
                if fields["part"] == last:  # its value claims the rest, in the buffer of its 8 bytes
                    fields["value"]["shape"] = [10**13 - entry["bounds"][-1]]
                    named = shard

    for shard in sorted(root.glob("shard-*.state")):
        _rewrite(shard, edit)
    return named


def _huge_dimensions(root: Path) -> Path:
    path = root / "manifest.json"
    manifest = check_json(json.loads(path.read_text()), "manifest")
    next(e for e in manifest["keys"] if e["key"] == "sw")["shape"] = [2**62] * 100_000
    path.write_bytes(dump_json(manifest))
    return path


def _shard_swapped(root: Path) -> Path:
    shutil.copy(root / "shard-0.state", root / "shard-1.state")
    return root / "shard-1.state"


def _shard_linked_out(root: Path) -> Path:
    outside = root.parent / "outside"
    shutil.copy(root / "shard-1.state", outside / "shard-1.state")
    (root / "shard-1.state").unlink()
    (root / "shard-1.state").symlink_to(outside / "shard-1.state")
    return root / "shard-1.state"


STORE_ATTACKS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a shard a FIFO": (lambda root: _fifo(root / "shard-1.state"), "FIFO"),
    "the manifest a FIFO": (lambda root: _fifo(root / "manifest.json"), "FIFO"),
    "a shard a link out of the folder": (_shard_linked_out, "symbolic link"),
    "shard 1 replaced by shard 0": (_shard_swapped, "header says shard 0"),
    "a shape of 100,000 dimensions of 2**62 in the manifest": (_huge_dimensions, "100000 dimensions"),
    "10**13 elements in the manifest and a shard's header": (_huge_key, r"\(\d+,\) in a buffer of"),
    "a key twice in the manifest": (
        lambda root: (
            _edit_json(root / "manifest.json", lambda s: s.replace("{", '{"clock": 5,', 1))
            or root / "manifest.json"
        ),
        "key 'clock' twice",
    ),
}


@pytest.mark.parametrize("attack", sorted(STORE_ATTACKS))
def test_a_crafted_store_checkpoint_is_refused_at_once_naming_the_file(tmp_path: Path, attack: str) -> None:
    root, outside = _store_saved(tmp_path), _outside(tmp_path)
    make, why = STORE_ATTACKS[attack]
    named = make(root)
    before = _snapshot(outside)

    def loading(kv: Any, comm: Communicator) -> Any:
        try:
            kv.load(root)
        except KVStoreError as error:
            return error
        return "loaded"

    # the store's default partitions: a claimed size is not cut into millions of them before it is checked
    outcomes, took = _bounded(lambda: run_store(2, loading, mode="async", partition_bytes=4 << 20), [named])
    assert not isinstance(outcomes, BaseException), outcomes
    assert all(isinstance(o, KVStoreError) for o in outcomes), outcomes
    texts = [str(o) for o in outcomes]
    assert str(named) in texts[0] and all(len(text) < 2000 for text in texts), texts
    assert re.search(why, texts[0]), texts
    assert _snapshot(outside) == before
    assert took < HANG_GUARD_S


FILE_CASES: dict[str, tuple[str, str]] = {
    # name: (the header's JSON text, what the error says); the data is 64 zero bytes
    "100,000 dimensions of 2**62": (
        '{"format":"F","owner":null,"size":64,"buffers":[[0,64]],"tree":{"t":"a","dtype":"<f8","shape":['
        + ",".join([str(2**62)] * 100_000)
        + '],"b":0}}',
        "100000 dimensions",
    ),
    "10**13 elements in a buffer of 64 bytes": (
        '{"format":"F","owner":null,"size":64,"buffers":[[0,64]],"tree":{"t":"a","dtype":"<f8",'
        '"shape":[10000000000000],"b":0}}',
        r"\(10000000000000,\) in a buffer of 64",
    ),
    "a key twice": (
        '{"format":"F","owner":null,"size":64,"buffers":[[0,64]],"tree":{"t":"b","b":0},"tree":null}',
        "key 'tree' twice",
    ),
    "buffers overlapping": (
        '{"format":"F","owner":null,"size":64,"buffers":[[0,64],[32,8]],'
        '"tree":{"t":"l","v":[{"t":"b","b":0},{"t":"b","b":1}]}}',
        "overlaps buffer 0",
    ),
    "two arrays on one buffer": (
        '{"format":"F","owner":null,"size":64,"buffers":[[0,64]],"tree":{"t":"l","v":['
        '{"t":"a","dtype":"<f8","shape":[8],"b":0},{"t":"a","dtype":"<i8","shape":[8],"b":0}]}}',
        "two values name buffer 0",
    ),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_a_crafted_state_file_is_refused_at_once_by_read_and_outline(tmp_path: Path, case: str) -> None:
    text, why = FILE_CASES[case]
    path = tmp_path / "crafted.state"
    for fmt in ("collectives.state/1", "collectives.state/2"):  # the one this code reads
        _write_state(path, text.replace('"F"', json.dumps(fmt)), bytes(64))
        for read in (read_state, read_outline):
            outcome, took = _bounded(lambda read=read: read(path))
            if isinstance(outcome, CheckpointError) and "expected 'collectives.state" in str(outcome):
                continue  # not this code's format
            assert isinstance(outcome, CheckpointError), (read.__name__, outcome)
            assert str(path) in str(outcome) and re.search(why, str(outcome)), str(outcome)[:300]
            assert len(str(outcome)) < 2000 and took < HANG_GUARD_S


def test_a_state_file_that_is_a_fifo_or_a_link_is_refused_at_once(tmp_path: Path) -> None:
    target = tmp_path / "real.state"
    target.write_bytes(b"".join(bytes(p) for p in state_pieces({"w": np.arange(3.0)})))
    fifo, link = tmp_path / "fifo.state", tmp_path / "link.state"
    os.mkfifo(fifo)
    link.symlink_to(target)
    for path, why in ((fifo, "FIFO"), (link, "symbolic link")):
        for read in (read_state, read_outline):
            outcome, took = _bounded(lambda read=read, path=path: read(path), [fifo])
            assert isinstance(outcome, CheckpointError) and str(path) in str(outcome), (
                read.__name__,
                outcome,
            )
            assert why in str(outcome) and took < HANG_GUARD_S


def test_a_tensor_of_100_000_dimensions_is_refused_before_the_codec_multiplies_them(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the tensors' codec needs torch")
    import collectives.torch_integration  # noqa: F401  (registers the tensors' codec)

    fields = {"dtype": "float32", "shape": [2**62] * 100_000, "requires_grad": False}
    tree = {"t": "x", "codec": "torch.tensor", "fields": fields, "b": 0}
    path = tmp_path / "tensor.state"
    header = {"format": "F", "owner": None, "size": 64, "buffers": [[0, 64]], "tree": tree}
    for fmt in ("collectives.state/1", "collectives.state/2"):
        _write_state(path, json.dumps({**header, "format": fmt}), bytes(64))
        outcome, took = _bounded(lambda: read_state(path))
        if isinstance(outcome, CheckpointError) and "expected 'collectives.state" in str(outcome):
            continue  # not this code's format
        assert isinstance(outcome, CheckpointError) and str(path) in str(outcome), str(outcome)[:300]
        assert "100000 dimensions" in str(outcome) and len(str(outcome)) < 2000 and took < HANG_GUARD_S
