"""The selector: its choice, its reasons, its explanation, and the calibration it reads per world size."""

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import algorithms, early_plan, selector, selector_agreement
from collectives.algorithms import ALGORITHMS, build_schedule, ring, schedule_traffic
from collectives.calibration import CALIBRATION_ENV, save_model
from collectives.errors import (
    CalibrationError,
    UnknownAlgorithmError,
    UnsupportedOpError,
)
from collectives.schedule import RankProgram, Schedule, Step, Transfer
from collectives.selector import Selector, check_algorithm
from collectives.topology.cost_model import DEFAULT_MODEL, CostModel

from .test_calibration import AT
from .test_cost_model import UNIT

Ranks = Callable[..., list[Any]]


pytestmark = pytest.mark.usefixtures("no_calibration_file")


def _direct_allreduce(world_size: int, count: int) -> Schedule:
    """One step: every rank sends its whole buffer to every other, which adds it in."""
    step = Step(Transfer(src, dst, 0, reduce=True) for src in range(world_size) for dst in range(world_size)
                if src != dst)  # fmt: skip
    return Schedule(f"allreduce-direct(n={world_size})", "allreduce", world_size, (count,), (step,))


def _register(monkeypatch: pytest.MonkeyPatch, name: str, **members: Any) -> ModuleType:
    """Register a fake algorithm module for this test only."""
    module = ModuleType(f"tests.fake_{name}")
    for key, value in members.items():
        setattr(module, key, value)
    monkeypatch.setitem(ALGORITHMS, name, module)
    return module


@pytest.fixture(autouse=True)
def _ring_as_the_only_real_algorithm() -> Iterator[None]:
    # the expected choices here must not depend on which other algorithms the library has;
    # the registry is restored in place, in its order, which breaks ties
    saved = dict(ALGORITHMS)
    ALGORITHMS.clear()
    ALGORITHMS["ring"] = saved["ring"]
    _forget_choices()
    yield
    ALGORITHMS.clear()
    ALGORITHMS.update(saved)
    _forget_choices()


def _forget_choices() -> None:
    # choices made with another registry must not leak into or out of these tests
    selector.selector_for.cache_clear()
    selector.default_selector.cache_clear()


# --- the choice


def test_the_choice_is_the_fastest_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, "direct_test", allreduce=_direct_allreduce)
    chooser = Selector(DEFAULT_MODEL)
    choices = {}
    for count in (0, 1, 10, 1000, 10_000, 100_000, 10**6):
        predicted = {
            name: DEFAULT_MODEL.predict(build_schedule("allreduce", name, 4, count), 4)
            for name in ("ring", "direct_test")
        }
        explanation = chooser.explain("allreduce", count, "float32", world_size=4)
        assert [c.time for c in explanation.candidates] == sorted(predicted.values())
        assert explanation.choice == min(predicted, key=lambda name: (predicted[name], name != "ring"))
        assert chooser.choose("allreduce", 4, count, 4) == explanation.choice
        choices[count] = explanation.choice
    # one step of 3 messages beats 6 ring steps until the 4x bytes outweigh 3 alphas
    assert choices == {0: "ring", 1: "direct_test", 10: "direct_test", 1000: "direct_test",
                       10_000: "direct_test", 100_000: "ring", 10**6: "ring"}  # fmt: skip


def test_a_cached_choice_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    counts = []

    def counting(*args: Any, **kwargs: Any) -> Schedule:
        builds.append(args)
        return build_schedule(*args, **kwargs)

    def counting_traffic(*args: Any) -> Any:
        counts.append(args)
        return schedule_traffic(*args)

    monkeypatch.setattr(algorithms, "build_schedule", counting)
    monkeypatch.setattr(algorithms, "schedule_traffic", counting_traffic)
    selector._counted.cache_clear()
    chooser = Selector(DEFAULT_MODEL)
    assert chooser.choose("allreduce", 6, 12345, 4) == "ring"
    # the ring's traffic is counted once, by formula: no schedule is built
    assert counts == [("allreduce", "ring", 6, 12345)] and builds == []
    ranked = []
    rank = chooser._rank

    def counting_rank(*args: Any) -> Any:
        ranked.append(args)
        return rank(*args)

    monkeypatch.setattr(chooser, "_rank", counting_rank)
    for _ in range(3):
        assert chooser.choose("allreduce", 6, 12345, 4) == "ring"
    assert counts == [("allreduce", "ring", 6, 12345)] and builds == [] and ranked == []
    assert chooser.choose("allreduce", 6, 12345, 8) == "ring"  # another itemsize is another choice
    chooser.clear()
    assert chooser.choose("allreduce", 6, 12345, 4) == "ring"
    assert len(ranked) == 2


def test_an_algorithm_with_reasons_is_rejected_and_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    def reasons(collective: str, world_size: int, count: int, features: frozenset[str]) -> list[str]:
        power = world_size & (world_size - 1) == 0
        return [] if power else [f"picky needs a power-of-two world size, not {world_size}"]

    _register(monkeypatch, "picky", allreduce=_direct_allreduce, not_supported_reasons=reasons)
    explanation = C.explain("allreduce", 64, world_size=3)
    assert [c.algorithm for c in explanation.candidates] == ["ring"]
    assert [(r.algorithm, r.reasons) for r in explanation.rejected] == [
        ("picky", ("picky needs a power-of-two world size, not 3",))
    ]
    text = str(explanation)
    assert "rejected:" in text
    assert "picky  picky needs a power-of-two world size, not 3" in text
    assert "choice: ring" in text
    assert {c.algorithm for c in C.explain("allreduce", 64, world_size=4).candidates} == {"ring", "picky"}
    # no builder for the collective is a reason too
    gather = C.explain("allgather", 64, "int8", world_size=4)
    assert [(r.algorithm, r.reasons) for r in gather.rejected] == [("picky", ("picky has no allgather",))]


def test_an_algorithm_that_fails_to_build_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(world_size: int, count: int) -> Schedule:
        raise ValueError(f"cannot split {count} elements")

    _register(monkeypatch, "broken_test", allreduce=broken)
    explanation = Selector(DEFAULT_MODEL).explain("allreduce", 10, world_size=2)
    assert explanation.choice == "ring"
    assert explanation.rejected[0].reasons == ("cannot be built: cannot split 10 elements",)


def test_no_candidate_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse = SimpleNamespace(not_supported_reasons=lambda *args: ["never"], allreduce=ring.allreduce)
    monkeypatch.setitem(algorithms.ALGORITHMS, "ring", refuse)
    chooser = Selector(DEFAULT_MODEL)
    explanation = chooser.explain("allreduce", 8, world_size=2)
    assert explanation.choice is None and "choice: none" in str(explanation)
    with pytest.raises(UnknownAlgorithmError, match=r"no algorithm runs allreduce .*\(ring: never\)"):
        chooser.choose("allreduce", 2, 8, 4)


def test_explanation_table() -> None:
    text = str(Selector(UNIT).explain("reduce_scatter", 12, "float64", world_size=3, op="max"))
    lines = text.splitlines()
    assert lines[0] == "reduce_scatter of 12 float64 (96 B) over 3 ranks, op max"
    assert lines[1].startswith("cost model: alpha 2000000.00 us/message")
    titles = lines[3].split()
    assert titles[:4] == ["algorithm", "schedule", "steps", "messages"]
    # 2 steps of 1 message and 32 bytes moved and reduced: 2*2 + 3*64 + 5*64 seconds
    assert lines[4].split() == ["*", "ring", "reduce_scatter-ring(n=3)", "2", "2", "0", "64", "0", "64",
                                "4000000.00", "192000000.00", "320000000.00", "516000000.00"]  # fmt: skip
    assert lines[-1] == "choice: ring (predicted 516000000.00 us)"
    assert "rejected" not in text


def test_explain_checks_its_arguments() -> None:
    with pytest.raises(UnsupportedOpError, match="op 'avg' does not apply to int32"):
        C.explain("allreduce", 8, "int32", world_size=2, op="avg")
    assert C.explain("allgather", 8, "int32", world_size=2, op="avg").op is None  # no reduction to check
    with pytest.raises(ValueError, match="unknown collective 'bcast'"):
        C.explain("bcast", 8, world_size=2)
    with pytest.raises(ValueError, match="need world_size >= 1 and count >= 0"):
        C.explain("allreduce", -1, world_size=2)


def test_an_explanations_repr_is_one_short_line_naming_the_choice() -> None:
    explanation = C.explain("allreduce", 1 << 20, world_size=4)
    shown = repr(explanation)
    assert "\n" not in shown and len(shown) < 200, shown
    assert shown.startswith("<Explanation allreduce of 4 MiB float32 over 4 ranks: ")
    assert f"{explanation.choice} (" in shown and "print() it for the table" in shown
    assert str(explanation).count("\n") > 5  # print() still shows the table


def test_explain_takes_the_world_size_from_the_communicator(ranks: Ranks) -> None:
    explanations = ranks(3, lambda comm: C.explain("allreduce", 30, comm=comm))
    assert [e.world_size for e in explanations] == [3, 3, 3]
    assert explanations[0].candidates[0].schedule == "allreduce-ring(n=3)"


def test_check_algorithm_lists_auto_first() -> None:
    check_algorithm("allreduce", "auto")
    check_algorithm("allgather", "ring")
    with pytest.raises(UnknownAlgorithmError, match="for reduce_scatter; valid algorithms are auto, ring"):
        check_algorithm("reduce_scatter", "tree")


# --- auto through the API


def test_auto_is_the_default_and_gives_what_ring_gives(ranks: Ranks) -> None:
    world_size = 4
    inputs = [np.arange(40, dtype=np.int32) * (r + 1) for r in range(world_size)]

    def run(comm: C.Communicator, algorithm: str | None) -> list[np.ndarray]:
        chosen = {} if algorithm is None else {"algorithm": algorithm}
        x = inputs[comm.rank]
        return [
            C.allreduce(x, comm=comm, **chosen),
            C.reduce_scatter(x, "max", comm=comm, **chosen),
            C.reduce_scatter(x, counts=(1, 0, 30, 9), comm=comm, **chosen),
            C.allgather(x[:3], comm=comm, **chosen),
            C.allgather(x[: comm.rank], counts=(0, 1, 2, 3), comm=comm, **chosen),
        ]

    by_default = ranks(world_size, lambda comm: run(comm, None))
    for algorithm in ("auto", "ring"):
        results = ranks(world_size, lambda comm, a=algorithm: run(comm, a))
        for mine, theirs in zip(by_default, results, strict=True):
            assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))


def test_auto_runs_the_algorithm_it_chooses(ranks: Ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, "direct_auto", allreduce=_direct_allreduce)
    ran = []
    original = early_plan.program_plan  # allreduce plans its rank's program once per call, then runs the plan

    def spy(program: RankProgram, *args: Any, **kwargs: Any) -> Any:
        ran.append(program.name)
        return original(program, *args, **kwargs)

    monkeypatch.setattr(early_plan, "program_plan", spy)
    inputs = [np.full(n, 1.5, np.float32) for n in (10, 10**6)]
    results = ranks(2, lambda comm: [C.allreduce(x, comm=comm) for x in inputs])
    for mine in results:
        assert [r.tolist() for r in mine] == [[3.0] * x.size for x in inputs]
    # small: one step beats two; large: the ring halves the bytes
    assert sorted(set(ran)) == ["allreduce-direct(n=2)", "allreduce-ring(n=2)"]
    assert ran[:2] == ["allreduce-direct(n=2)"] * 2


def test_the_ranks_agree_on_rank_0s_model(ranks: Ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks that read different calibrations would choose differently and deadlock; they take rank 0's."""
    _register(monkeypatch, "direct_agree", allreduce=_direct_allreduce)
    # rank 0 finds latency dear (direct wins), the others find bandwidth dear (ring wins)
    models = {0: CostModel(1.0, 0.0, 0.0)} | {r: CostModel(0.0, 1.0, 0.0) for r in (1, 2)}
    asked = []

    def local(world_size: int) -> Selector:
        asked.append(world_size)
        return Selector(models[int(threading.current_thread().name.removeprefix("rank-"))])

    monkeypatch.setattr(selector_agreement, "default_selector", local)

    def run(comm: C.Communicator) -> tuple[np.ndarray, CostModel, str | None]:
        result = C.allreduce(np.ones(100, np.int64), comm=comm)
        choice = C.explain("allreduce", 100, "int64", comm=comm).choice
        assert comm.selector is not None  # agreed by the allreduce
        return result, comm.selector.model, choice

    for result, model, choice in ranks(3, run):
        assert np.array_equal(result, np.full(100, 3))
        assert model == models[0]
        assert choice == "direct_agree"
    assert asked == [3]  # only rank 0 reads a calibration, the one for the communicator's size


def test_a_bad_calibration_on_rank_0_fails_every_rank(ranks: Ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    def local(world_size: int) -> Selector:
        if threading.current_thread().name == "rank-0":
            raise CalibrationError("malformed calibration /somewhere: not JSON")
        return Selector(DEFAULT_MODEL)

    monkeypatch.setattr(selector_agreement, "default_selector", local)
    failures = []

    def run(comm: C.Communicator) -> None:
        try:
            C.allreduce(np.ones(4), comm=comm)
        except CalibrationError as error:
            failures.append(str(error))

    ranks(3, run)
    assert sorted(failures) == [
        "malformed calibration /somewhere: not JSON",
        "rank 0 could not load its calibration; see its error",
        "rank 0 could not load its calibration; see its error",
    ]


def test_an_unknown_name_is_refused_before_anything_is_chosen(ranks: Ranks) -> None:
    def run(comm: C.Communicator) -> None:
        for call in (
            lambda: C.allreduce(np.ones(4), algorithm="Auto", comm=comm),
            lambda: C.reduce_scatter(np.ones(4), algorithm="tree", comm=comm),
            lambda: C.allgather(np.ones(4), algorithm="", comm=comm),
        ):
            with pytest.raises(UnknownAlgorithmError, match="valid algorithms are auto, ring"):
                call()
        assert comm.selector is None

    ranks(2, run)


# --- the calibration the selector reads, per world size


def test_the_env_var_points_the_selector_at_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    selector.default_selector.cache_clear()
    assert selector.default_selector(2).model == DEFAULT_MODEL
    assert "defaults (no calibration at" in selector.default_selector(2).model.source
    save_model(CostModel(1.0, 0.0, 0.0))
    assert selector.default_selector(2).model == DEFAULT_MODEL  # read once per world size
    selector.default_selector.cache_clear()
    assert selector.default_selector(2).model == CostModel(1.0, 0.0, 0.0)
    assert str(path) in str(C.explain("allreduce", 10, world_size=2))


def test_the_default_selector_is_kept_per_world_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    save_model(AT[2], world_size=2)
    save_model(AT[4], world_size=4)
    selector.default_selector.cache_clear()
    two, four, three = (selector.default_selector(size) for size in (2, 4, 3))
    assert (two.model, four.model, three.model) == (AT[2], AT[4], AT[4])
    assert selector.default_selector(2) is two  # read once per size
    assert three.model.source.endswith("(none at 3)")
    # an explanation without a communicator weighs with the calibration of the size it explains
    assert C.explain("allreduce", 10, world_size=2).model == AT[2]
    assert (
        C.explain("allreduce", 10, world_size=8).model.source
        == f"calibrated at 4 ranks, from {path} (none at 8)"
    )


def test_the_ranks_use_the_calibration_of_their_world_size(
    ranks: Ranks, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _register(monkeypatch, "direct_sized", allreduce=_direct_allreduce)
    path = tmp_path / "calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    # at 2 ranks latency is dear (one direct step wins), at 3 bandwidth (the ring wins)
    latency, bandwidth = CostModel(1.0, 0.0, 0.0), CostModel(0.0, 1.0, 0.0)
    save_model(latency, world_size=2)
    save_model(bandwidth, world_size=3)
    selector.default_selector.cache_clear()

    def run(comm: C.Communicator) -> tuple[str, str, str | None, CostModel]:
        before = C.explain("allreduce", 100, "int64", comm=comm).model.source  # nothing agreed yet
        result = C.allreduce(np.ones(100, np.int64), comm=comm)
        assert np.array_equal(result, np.full(100, comm.size))
        assert comm.selector is not None  # agreed by the allreduce
        model = comm.selector.model
        return before, model.source, C.explain("allreduce", 100, "int64", comm=comm).choice, model

    for size, expected, choice, source in (
        (2, latency, "direct_sized", f"calibrated at 2 ranks, from {path}"),
        (3, bandwidth, "ring", f"calibrated at 3 ranks, from {path}"),
        (4, bandwidth, "ring", f"calibrated at 3 ranks, from {path} (none at 4)"),
    ):
        results = ranks(size, run)
        assert [before for before, _, _, _ in results] == [source] * size
        assert [agreed for _, agreed, _, _ in results] == [source] + ["calibration of rank 0"] * (size - 1)
        assert all(c == choice and model == expected for _, _, c, model in results), size


def test_the_measured_corrections_travel_with_rank_0s_constants(
    ranks: Ranks, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a rank without them would choose another algorithm and wait on the others forever
    _register(monkeypatch, "direct_sized", allreduce=_direct_allreduce)
    path = tmp_path / "calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    latency = CostModel(1.0, 0.0, 0.0)  # one direct step wins ...
    measured = replace(
        latency, corrections=(("direct_sized", ((8, 50.0), (1 << 20, 60.0))),)
    )  # ... till timed
    save_model(measured, world_size=3)
    selector.default_selector.cache_clear()

    def run(comm: C.Communicator) -> tuple[str | None, CostModel]:
        result = C.allreduce(np.ones(100, np.int64), comm=comm)
        assert np.array_equal(result, np.full(100, comm.size))
        assert comm.selector is not None
        return C.explain("allreduce", 100, "int64", comm=comm).choice, comm.selector.model

    results = ranks(3, run)
    assert all(model.corrections == measured.corrections for _, model in results)
    assert {choice for choice, _ in results} == {"ring"}


# --- shared memory: barriers in the model


def _with_shared_memory_and_butterfly() -> None:
    from collectives.algorithms import butterfly, shared_memory

    ALGORITHMS["butterfly"] = butterfly
    ALGORITHMS["shared_memory"] = shared_memory
    _forget_choices()


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_default_model_sends_small_allreduces_through_shared_memory(world_size: int) -> None:
    # its one barrier carries the call's signature, which every call on shared memory passes anyway
    _with_shared_memory_and_butterfly()
    shm = frozenset({"shared_memory"})
    for nbytes in (4, 8, 64, 1024, 16 * 1024):
        choice = selector.default_selector(world_size).choose("allreduce", world_size, nbytes // 4, 4, shm)
        assert choice == "shared_memory", (world_size, nbytes)
        plain = selector.default_selector(world_size).choose("allreduce", world_size, nbytes // 4, 4)
        assert plain != "shared_memory"


def test_barriers_cost_per_peer_and_appear_in_the_explanation() -> None:
    _with_shared_memory_and_butterfly()
    model = CostModel(alpha=0.0, beta=0.0, gamma=0.0, barrier=1.0)
    assert model.barrier_time(1) == 0 and model.barrier_time(4) == 3.0
    shm_only = frozenset({"shared_memory"})
    explained = Selector(model).explain("reduce_scatter", 16, world_size=4, features=shm_only)
    shm = next(c for c in explained.candidates if c.algorithm == "shared_memory")
    assert shm.traffic.barriers == 1 and shm.traffic.messages == 0
    assert shm.latency == 3.0  # one barrier, waiting for three peers
    assert explained.choice != "shared_memory"  # messages are free in this model, barriers are not
    # an allreduce's first barrier carries the signature, which every call on shared memory passes
    small = Selector(model).explain("allreduce", 16, world_size=4, features=shm_only)
    assert next(c for c in small.candidates if c.algorithm == "shared_memory").traffic.barriers == 0
    assert "barriers" in str(explained) and "barrier 1000000.00 us/peer" in str(explained)
    # the barrier count follows the segments: a large allreduce passes one per segment and phase
    from collectives.algorithms import shared_memory

    steps, messages, _, _, barriers, _ = shared_memory.traffic("allreduce", 4, 64 * 1024**2)
    assert messages == 0 and barriers == steps - 1 > 2


def test_shared_memory_copies_are_weighed_at_the_copy_cost() -> None:
    _with_shared_memory_and_butterfly()
    from collectives.algorithms import shared_memory
    from collectives.shared_sizes import SEGMENT_BYTES

    assert shared_memory.SEGMENT_ELEMENTS * 4 == SEGMENT_BYTES  # the model counts the executor's segments
    count, p = 1 << 22, 4
    share = count // p
    steps, messages, elements, reduced, barriers, copied = shared_memory.traffic("allreduce", p, count)
    # in: the other owners' parts of the input; out: the whole result; two barriers per segment
    assert (messages, elements, copied, reduced) == (0, 0, (p - 1) * share + count, (p - 1) * share)
    assert barriers + 1 == steps == 2 * -(-share // shared_memory.SEGMENT_ELEMENTS)
    only_copies = CostModel(alpha=0.0, beta=0.0, gamma=0.0, barrier=0.0, copy=1.0)
    explained = Selector(only_copies).explain(
        "allreduce", count, world_size=p, features=frozenset({"shared_memory"})
    )
    shm = next(c for c in explained.candidates if c.algorithm == "shared_memory")
    assert shm.time == copied * 4 and shm.traffic.copied == copied
    assert "bytes copied" in str(explained) and "copy 1000000000.0000 ns/byte" in str(explained)
    assert explained.choice != "shared_memory"  # every other algorithm is free in this model


def test_an_oversubscribed_node_goes_through_its_own_segments() -> None:
    import os

    from collectives.algorithms import shared_memory
    from collectives.shared_sizes import (
        OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES,
        OVERSUBSCRIBED_SEGMENT_BYTES,
        oversubscribed,
    )

    assert shared_memory.OVERSUBSCRIBED_SEGMENT_ELEMENTS * 4 == OVERSUBSCRIBED_SEGMENT_BYTES
    assert shared_memory.OVERSUBSCRIBED_ROOTED_SEGMENT_ELEMENTS * 4 == OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES
    cores = os.cpu_count() or 1
    assert not oversubscribed(cores) and oversubscribed(cores + 1)
    count = 1 << 24
    plain = shared_memory.traffic("allreduce", 4, count, frozenset({"shared_memory"}))
    crowded = shared_memory.traffic("allreduce", 4, count, frozenset({"shared_memory", "oversubscribed"}))
    # two barriers per segment less the first; the copies do not change
    segments = (count // 4) // shared_memory.SEGMENT_ELEMENTS, (count // 4) // (1 << 16)
    assert (plain[4] + 1, crowded[4] + 1) == (2 * segments[0], 2 * segments[1])
    assert plain[5] == crowded[5]


def test_a_small_shared_memory_allreduce_is_counted_as_one_barrier_and_whole_reductions() -> None:
    from collectives.algorithms import shared_memory
    from collectives.shared_sizes import COMPILED_SMALL_READ_BYTES, SMALL_TOTAL_BYTES, small_bytes

    assert shared_memory.SMALL_ELEMENTS * 4 == SMALL_TOTAL_BYTES  # the model follows the executor
    assert shared_memory.COMPILED_SMALL_READ_ELEMENTS * 4 == COMPILED_SMALL_READ_BYTES
    compiled = frozenset({"shared_memory", shared_memory.COMPILED})
    for p in (2, 3, 4, 8):  # the compiled engine's one barrier reaches further, less far with more ranks
        small = small_bytes(p, compiled=True) // 4
        assert shared_memory.traffic("allreduce", p, small, compiled)[0] == 1
        assert shared_memory.traffic("allreduce", p, small + 1, compiled)[0] >= 2  # two a segment
        further = small_bytes(p, compiled=True) > small_bytes(p, compiled=False)
        assert (shared_memory.traffic("allreduce", p, small)[0] >= 2) == further, p
    assert small_bytes(2, compiled=True) == 1 << 19 and small_bytes(4, compiled=True) == 1 << 17
    for p in (2, 3, 4, 8):
        small = shared_memory.SMALL_ELEMENTS // p
        # all inputs together within the limit: each rank copies its input in and reduces all of it
        assert shared_memory.traffic("allreduce", p, small) == (1, 0, 0, (p - 1) * small, 0, small)
        steps, _, _, reduced, barriers, _ = shared_memory.traffic("allreduce", p, small + 1)
        assert (steps, barriers) == (2, 1) and reduced < (p - 1) * small  # only its share, beyond it
