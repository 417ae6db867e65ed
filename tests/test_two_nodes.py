"""Two nodes: the node split feeds the selector and explain, and calibrations keep each class of link."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives.algorithms import build_schedule
from collectives.calibration import load_model, save_model
from collectives.topology.cost_model import DEFAULT_MODEL, CostModel, traffic
from collectives.transport.base import NodeSplit
from collectives.transport.loopback import LoopbackTransport, LoopbackWorld
from tests.shared_threads import ThreadWorld

pytestmark = pytest.mark.usefixtures("no_calibration_file")


class TwoNodes(LoopbackTransport):
    """A loopback rank that reports a node split: ranks r // per_node share a node's (threads') memory."""

    def __init__(self, world: LoopbackWorld, rank: int, split: NodeSplit) -> None:
        super().__init__(world, rank)
        self._split = split

    def node_split(self) -> NodeSplit:
        return self._split


def _run_on_nodes(nodes: int, per_node: int, fn: Any) -> list[Any]:
    """``fn(comm)`` on ``nodes`` x ``per_node`` loopback ranks whose transport reports that node split."""
    size = nodes * per_node
    world = LoopbackWorld(size, timeout=30.0)
    memories = [ThreadWorld(per_node, 1 << 16) for _ in range(nodes)]
    rails = [LoopbackWorld(nodes, timeout=30.0) for _ in range(per_node)]

    def rank(transport: Any) -> Any:
        r = transport.rank
        node, local = divmod(r, per_node)
        split = NodeSplit(
            memories[node].memory(local),
            tuple(range(node * per_node, (node + 1) * per_node)),
            rails[local].transport(node),
            tuple(k * per_node + local for k in range(nodes)),
        )
        return fn(C.Communicator(TwoNodes(world, r, split)))

    return world.run(rank)


def test_a_transport_reporting_two_nodes_makes_explain_list_both_link_classes() -> None:
    def body(comm: C.Communicator) -> tuple[Any, str]:
        features = comm.features  # the node split, found as dispatch finds it
        explanation = C.explain("allreduce", 1 << 18, "float32", comm=comm)
        return features, explanation

    for features, explanation in _run_on_nodes(2, 2, body):
        assert "ranks_per_node=2" in features
        assert explanation.nodes == (2, 2)
        text = str(explanation)
        assert "within a node (shared memory)" in text
        assert "between 2 nodes (network)" in text
        # the algorithm that needs the node split is weighed, not rejected as it was
        assert "hierarchical_shared_memory" in [c.algorithm for c in explanation.candidates]


def test_explain_names_what_dispatch_runs_on_two_nodes() -> None:
    def body(comm: C.Communicator) -> tuple[str, list[str]]:
        x = np.arange(1 << 16, dtype=np.float32)
        result = C.allreduce(x, comm=comm)
        assert np.array_equal(result, x * 4)
        return C.explain("allreduce", x.size, "float32", comm=comm).choice or "", comm.flight_record()

    for choice, record in _run_on_nodes(2, 2, body):
        assert any(f"algorithm={choice}" in line or f" {choice} " in f" {line} " for line in record), (
            choice,
            record,
        )


def test_steps_between_nodes_are_charged_at_the_networks_constants() -> None:
    ring = build_schedule("allreduce", "ring", 4, 4096)
    hierarchical = build_schedule("allreduce", "hierarchical", 4, 4096)
    # every step of a ring over 2 nodes of 2 crosses; the hierarchy crosses only on its rail
    assert traffic(ring, 2).network_messages == traffic(ring).messages
    split = traffic(hierarchical, 2)
    assert 0 < split.network_messages < split.messages
    assert traffic(hierarchical).network_messages == 0  # on one node nothing crosses
    slow = CostModel(1e-6, 1e-10, 0.0, network_alpha=1e-3, network_beta=1e-8)
    inside = sum(slow.terms(split, 4, 4))
    across = sum(slow.terms(split, 4, 4, ranks_per_node=2))
    expected = (
        1e-6 * (split.messages - split.network_messages)
        + 1e-3 * split.network_messages
        + 1e-10 * 4 * (split.elements - split.network_elements)
        + 1e-8 * 4 * split.network_elements
    )
    assert across == pytest.approx(expected)
    assert across > inside


def test_calibrations_keep_each_link_class_per_job_shape(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    one_node = CostModel(2e-6, 3e-10, 7e-11, 4e-6, 1e-10)
    two_nodes = CostModel(3e-6, 4e-10, 7e-11, 5e-6, 2e-10, network_alpha=4e-5, network_beta=9e-10)
    save_model(one_node, path, world_size=4)
    save_model(two_nodes, path, world_size=4, nodes=2)
    saved = json.loads(path.read_text())["calibrations"]
    assert set(saved) == {"4", "2x2"}
    assert (saved["2x2"]["network_alpha"], saved["2x2"]["network_beta"]) == (4e-5, 9e-10)
    assert load_model(path, world_size=4, nodes=2) == two_nodes  # every constant, both classes
    assert load_model(path, world_size=4) == one_node
    assert "2 nodes of 2 ranks" in load_model(path, world_size=4, nodes=2).source
    # a shape never calibrated: the node's constants of its world size, the network's defaults
    other = load_model(path, world_size=4, nodes=4)  # 4 nodes of 1 rank is not 2x2
    assert other == one_node and other.network_beta is None
    fallback = load_model(path, world_size=6, nodes=3)
    assert fallback.network_alpha == DEFAULT_MODEL.network_alpha and fallback.network_beta is None
    assert "no calibration of 3x2 nodes" in fallback.source


def test_a_malformed_network_constant_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    entry = {"alpha": 1e-6, "beta": 1e-9, "gamma": 0, "network_alpha": -1, "world_size": 4}
    path.write_text(json.dumps({"calibrations": {"2x2": entry}}))
    with pytest.raises(C.CalibrationError, match="network_alpha must be a non-negative number"):
        load_model(path, world_size=4, nodes=2)
    path.write_text(json.dumps({"calibrations": {"2x3": dict(entry, network_alpha=1e-5)}}))
    with pytest.raises(C.CalibrationError, match="its world_size is 4"):
        load_model(path, world_size=6, nodes=2)


def test_explain_says_when_the_node_split_is_not_known_yet() -> None:
    def body(comm: C.Communicator) -> tuple[str, str]:
        before = str(C.explain("allreduce", 1024, comm=comm))
        comm.features  # noqa: B018 - collective: finds the nodes
        return before, str(C.explain("allreduce", 1024, comm=comm))

    for before, after in _run_on_nodes(2, 2, body):
        assert "node split is not known yet" in before
        assert "not known" not in after and "between 2 nodes (network)" in after
