"""Topologies: devices and links, presets, ring packing, and the cost model of a schedule's time."""

__all__ = [
    "CostModel",
    "Device",
    "Link",
    "Prediction",
    "RingPacking",
    "Route",
    "Topology",
    "Traffic",
    "dgx1",
    "find_rings",
    "fully_connected",
    "multi_node",
    "pack_rings",
    "pcie_switch",
    "predict",
    "ring",
    "traffic",
]

from .cost_model import CostModel, Traffic, traffic
from .graph import Device, Link, Route, Topology
from .link_model import Prediction, predict
from .presets import dgx1, fully_connected, multi_node, pcie_switch, ring
from .rings import RingPacking, find_rings, pack_rings
