"""The ``collectives`` backend of torch.distributed (c10d): process groups over communicators, and ``mpi://``.

Importing it registers the backend and the rendezvous (``import collectives.torch_integration`` does).
"""

__all__ = ["BACKEND", "RENDEZVOUS", "MPIProcessGroup"]

from .backend import BACKEND, RENDEZVOUS, MPIProcessGroup
