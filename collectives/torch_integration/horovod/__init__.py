"""The bodies of Horovod's PyTorch API; :mod:`collectives.horovod` is the face that hands their names on.

``basics`` (init, ranks, op constants), ``ops`` (the tensor collectives and their
handles), ``functions`` (objects, parameters and optimizer state), ``optimizer``
(``DistributedOptimizer``), ``compression``, ``elastic`` and ``sync_batch_norm``.
"""
