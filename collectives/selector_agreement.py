"""The selector's agreement: rank 0's cost model, constants and measured corrections, taken by every rank.

Ranks whose calibrations differ would choose different algorithms for one
``"auto"`` call and wait on each other for ever, so on a communicator's first
``"auto"`` call rank 0 loads its calibration and sends the cost model to the
others, under that call's deadline; every rank then chooses with the same one.
"""

__all__ = ["agree_on_selector"]

import json
import math
import struct

from .call import Call
from .errors import CalibrationError
from .selector import Selector, default_selector, selector_for
from .topology.cost_model import CostModel
from .transport.base import Transport
from .transport.tags import Tag

# the cost model rank 0 sends: alpha, beta, gamma, barrier, copy, network alpha, network beta (-1: none),
# overhead, step
_MODEL_FORMAT = struct.Struct("<9dq")  # the constants, then the bytes of the corrections' message after it
_STEP = "the selector's agreement"


def agree_on_selector(call: Call, transport: Transport, nodes: int = 1) -> Selector:
    """Rank 0's selector on every rank of ``transport``: rank 0 sends its cost model under ``call``.

    Args:
        nodes: the job's nodes; on several, rank 0 reads the calibration of the job's shape.

    Raises:
        CalibrationError: rank 0 could not load its calibration (on every rank).
        CollectiveTimeout: rank 0's constants did not come in time.
    """
    size = transport.size
    if size == 1:
        return default_selector(size)
    if transport.rank == 0:
        return _send_model(call, transport, nodes)
    message = bytearray(_MODEL_FORMAT.size)
    call.exchange(transport, [], [(message, 0)], Tag.SELECTOR, _STEP)
    alpha, beta, gamma, barrier, copy, network_alpha, network_beta, overhead, step_cost, length = (
        _MODEL_FORMAT.unpack(message)
    )
    if math.isnan(alpha):
        raise CalibrationError("rank 0 could not load its calibration; see its error")
    corrections: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    if length:
        text = bytearray(length)
        call.exchange(transport, [], [(text, 0)], Tag.SELECTOR, _STEP)
        corrections = tuple(
            (str(name), tuple((int(b), float(r)) for b, r in points)) for name, points in json.loads(text)
        )
    between = None if network_beta < 0 else network_beta
    model = CostModel(
        alpha,
        beta,
        gamma,
        barrier,
        copy,
        network_alpha,
        between,
        overhead,
        step_cost,
        corrections,
        source="calibration of rank 0",
    )
    return selector_for(model)


def _send_model(call: Call, transport: Transport, nodes: int) -> Selector:
    """Rank 0's part: load the calibration, send its cost model to every other rank; its selector."""
    message = bytearray(_MODEL_FORMAT.size)
    peers = [peer for peer in range(transport.size) if peer != transport.rank]
    try:
        selector = default_selector(transport.size) if nodes == 1 else default_selector(transport.size, nodes)
    except CalibrationError:
        # tell the others, or they would wait for constants that never come
        _MODEL_FORMAT.pack_into(message, 0, *(math.nan,) * 9, 0)
        call.exchange(transport, [(message, p) for p in peers], [], Tag.SELECTOR, _STEP)
        raise
    model = selector.model
    sent = -1.0 if model.network_beta is None else model.network_beta
    constants = (model.alpha, model.beta, model.gamma, model.barrier, model.copy, model.network_alpha)
    # the measured corrections change choices as much as the constants do: they go too (JSON keeps
    # a float's every bit), in a second message of the same tag, which MPI delivers after the first
    measured = bytearray(json.dumps(model.corrections).encode()) if model.corrections else bytearray()
    _MODEL_FORMAT.pack_into(message, 0, *constants, sent, model.overhead, model.step, len(measured))
    sends = [(message, p) for p in peers]
    sends += [(measured, p) for p in peers] if measured else []
    call.exchange(transport, sends, [], Tag.SELECTOR, _STEP)
    return selector
