"""Topologies: devices and links, presets, ring packing, and the cost model that predicts time."""

__all__ = [
    "Device",
    "Link",
    "Prediction",
    "RingPacking",
    "Route",
    "Topology",
    "dgx1",
    "find_rings",
    "fully_connected",
    "multi_node",
    "pack_rings",
    "pcie_switch",
    "predict",
    "ring",
]

from .cost_model import Prediction, predict
from .graph import Device, Link, Route, Topology
from .presets import dgx1, fully_connected, multi_node, pcie_switch, ring
from .rings import RingPacking, find_rings, pack_rings
