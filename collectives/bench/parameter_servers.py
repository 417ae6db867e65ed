"""``bench simulate --parameter-servers``: a parameter server's round predicted on 1 to M machines.

The seeds' argument: with one central server, m workers' gradients all cross
that server's link, so a round takes O(m); spread over n servers, each
carries 1/n of every worker's gradient, O(m / n); with the servers on the
workers' own machines (n = m, as :mod:`collectives.kvstore` places them by
default, every rank a server) the time stays flat as machines are added.
Each line here is that round, a push then a pull of ``size`` bytes by every
GPU of ``m`` machines of the ``multi_node`` topology, timed by the link model
from the ranks' programs (:func:`collectives.topology.programs.predict_programs`):

* ``central server``: one server process on the CPU of a machine of its own;
* ``N sharded servers``: N such server machines, each holding 1/N of the buffer
  (:func:`collectives.topology.strategies.server_program`);
* ``colocated (every rank a server)``: rank r holds chunk r and aggregates it
  (:func:`collectives.topology.strategies.split_star_program`);
* ``ring allreduce`` and ``hierarchical allreduce``, the collectives' answer, for comparison.
"""

__all__ = ["LINES", "parameter_server_sweep"]

from functools import partial

from collectives.prediction import predict_algorithm
from collectives.topology import multi_node
from collectives.topology.programs import predict_programs
from collectives.topology.strategies import server_program, split_star_program

from .sweep import Sweep

LINES = ("central server", "{n} sharded servers", "colocated (every rank a server)", "ring allreduce",
         "hierarchical allreduce")  # fmt: skip
"""The lines of the sweep, in order; ``{n}`` is the number of sharded servers."""


def parameter_server_sweep(
    size: int, itemsize: int, *, gpus_per_node: int, nic_gbps: float, max_machines: int, servers: int
) -> Sweep:
    """Each line's predicted round on 1, 2, 4, ... ``max_machines`` machines of ``gpus_per_node`` GPUs.

    Dedicated servers run on machines of their own, after the workers'; every
    GPU of the workers' machines is a worker.

    Raises:
        ValueError: fewer than one machine or server.
    """
    if max_machines < 1 or servers < 1 or gpus_per_node < 1:
        raise ValueError(
            f"need at least one machine, GPU and server; got {max_machines}, {gpus_per_node} and {servers}"
        )
    count = size // itemsize
    machines = tuple(2**k for k in range(max_machines.bit_length()) if 2**k <= max_machines)
    names = [line.format(n=servers) for line in LINES]
    times: dict[str, list[float | None]] = {name: [] for name in names}
    for m in machines:
        workers = m * gpus_per_node
        for name, dedicated in zip(names[:2], (1, servers), strict=True):
            topology = multi_node(m + dedicated, gpus_per_node, nic_gbps)
            placement = (*topology.gpus[:workers], *(f"cpu{m + k}" for k in range(dedicated)))
            found = predict_programs(
                partial(server_program, workers, dedicated, count),
                workers + dedicated,
                topology,
                itemsize,
                placement,
            )
            times[name].append(found.time_s)
        topology = multi_node(m, gpus_per_node, nic_gbps)
        found = predict_programs(partial(split_star_program, workers, count), workers, topology, itemsize)
        times[names[2]].append(found.time_s)
        for name, algorithm in zip(names[3:], ("ring", "hierarchical"), strict=True):
            times[name].append(predict_algorithm("allreduce", algorithm, count, itemsize, topology).time_s)
    topology_name = f"multi_node(m, {gpus_per_node}, {nic_gbps:g}), servers on machines of their own"
    return Sweep(topology_name, machines, {k: tuple(v) for k, v in times.items()}, {}, axis="machines")
