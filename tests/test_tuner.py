"""The online tuner: the best predicted algorithms timed on first calls, one agreed on by every rank."""

import numpy as np
import pytest

import collectives as C
from collectives.errors import ConfigurationError
from collectives.selector import default_selector
from collectives.transport.loopback import LoopbackWorld
from collectives.tuner import ROUNDS, TUNE_ENV, Tuner, tuning_wanted

pytestmark = pytest.mark.usefixtures("no_calibration_file")


class ForcedClock:
    """A clock whose every trial of candidate j lasts ``durations[j]`` (trials run the candidates in turn)."""

    def __init__(self, durations: list[float]) -> None:
        self.durations = durations
        self.now = 0.0
        self.calls = 0

    def __call__(self) -> float:
        if self.calls % 2:  # a trial's end
            trial = self.calls // 2
            self.now += self.durations[trial % len(self.durations)]
        self.calls += 1
        return self.now


# rank 0 alone would keep candidate 0, rank 1 candidate 1; the slowest ranks' times make it candidate 2
FORCED = [[1.0, 5.0, 2.0], [10.0, 3.0, 4.0]]


def _tuned(comm: C.Communicator) -> tuple[str, tuple[tuple[str, float], ...], list[str], bool]:
    assert comm.tuner is not None
    comm.tuner.clock = ForcedClock(FORCED[comm.rank])
    x = np.arange(4096, dtype=np.float32)
    trials = 3 * (ROUNDS + 1)
    kept_during_trials = False
    for _ in range(trials + 3):
        result = C.allreduce(x, comm=comm)
        assert np.array_equal(result, x * comm.size)  # every trial's result is right
        kept_during_trials |= comm.tuner.timing
    explanation = C.explain("allreduce", x.size, "float32", comm=comm)
    candidates = [c.algorithm for c in explanation.candidates]
    assert explanation.choice is not None
    return explanation.choice, explanation.measured, candidates[:3], kept_during_trials


def test_the_tuner_agrees_on_one_algorithm_when_timings_differ_by_rank() -> None:
    world = LoopbackWorld(2, timeout=30.0)
    results = world.run(lambda transport: _tuned(C.Communicator(transport, tune=True)))
    (choice0, measured0, best0, _), (choice1, measured1, _, _) = results
    assert choice0 == choice1  # one decision, on every rank
    assert choice0 == best0[2]  # the least of the slowest ranks' times, not either rank's own best
    assert measured0 == measured1
    assert dict(measured0) == {best0[0]: 10.0, best0[1]: 5.0, best0[2]: 4.0}


def test_explain_reports_what_the_tuner_measured() -> None:
    world = LoopbackWorld(2, timeout=30.0)

    def body(transport: object) -> str:
        comm = C.Communicator(transport, tune=True)  # type: ignore[arg-type]
        _tuned(comm)
        return str(C.explain("allreduce", 4096, "float32", comm=comm))

    for text in world.run(body):
        assert "measured by the tuner (slowest rank, median):" in text
        assert "(measured fastest; predicted" in text


def test_trial_calls_stay_off_the_fast_path_until_chosen() -> None:
    world = LoopbackWorld(2, timeout=30.0)

    def body(transport: object) -> tuple[int, int]:
        comm = C.Communicator(transport, tune=True)  # type: ignore[arg-type]
        assert comm.tuner is not None
        comm.tuner.clock = ForcedClock(FORCED[comm.rank])
        x = np.ones(256, np.float32)
        for _ in range(3 * (ROUNDS + 1)):
            C.allreduce(x, comm=comm)
        during = len(comm.repeats)
        for _ in range(3):
            C.allreduce(x, comm=comm)
        return during, len(comm.repeats)

    for during, after in world.run(body):
        assert during == 0  # no trial was remembered for the fast path
        assert after == 1  # the chosen algorithm is


def test_tuning_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TUNE_ENV, raising=False)
    assert not tuning_wanted(None)
    assert tuning_wanted(True)
    monkeypatch.setenv(TUNE_ENV, "1")
    assert tuning_wanted(None)
    assert not tuning_wanted(False)
    monkeypatch.setenv(TUNE_ENV, "maybe")
    with pytest.raises(ConfigurationError, match="COLLECTIVES_TUNE='maybe' is neither 1 nor 0"):
        tuning_wanted(None)


def test_a_single_candidate_is_decided_without_trials() -> None:
    tuner = Tuner(candidates=1)
    world = LoopbackWorld(1, timeout=5.0)

    def body(transport: object) -> str | None:
        comm = C.Communicator(transport, tune=True)  # type: ignore[arg-type]
        comm.tuner = tuner
        C.allreduce(np.ones(8, np.float32), comm=comm)
        return tuner.decided("allreduce", 1, 8, 4, comm.features)

    # decided on the first call, with no trial and no agreement: the model's choice
    assert world.run(body) == [default_selector(1).choose("allreduce", 1, 8, 4)]
    assert not tuner.timing


INITS = {
    "allreduce": lambda x, comm: C.allreduce_init(x, comm=comm),
    "reduce_scatter": lambda x, comm: C.reduce_scatter_init(x, comm=comm),
    "allgather": lambda x, comm: C.allgather_init(x, comm=comm),
    "broadcast": lambda x, comm: C.broadcast_init(x, comm=comm),
}


@pytest.mark.parametrize("collective", sorted(INITS))
def test_persistent_starts_run_the_algorithm_their_init_chose(collective: str) -> None:
    # with the tuner on, an "auto" call tries its candidates in turn: a start must not be one of them
    world = LoopbackWorld(2, timeout=30.0)

    def body(transport: object) -> tuple[str, list[str]]:
        comm = C.Communicator(transport, tune=True)  # type: ignore[arg-type]
        persistent = INITS[collective](np.arange(4096, dtype=np.float32), comm)
        for _ in range(3 * (ROUNDS + 1) + 2):
            persistent()
        started = [line for line in comm.flight_record() if f" {collective} " in line]
        return persistent.algorithm, [line.split("algorithm=")[1].split()[0] for line in started]

    for chosen, ran in world.run(body):
        assert len(ran) == 3 * (ROUNDS + 1) + 2
        assert set(ran) == {chosen}
