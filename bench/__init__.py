"""``python -m bench ...`` in the repository: the benchmark suite the package ships, ``collectives.bench``.

The modules are found in the package's folder, so ``python -m bench allreduce`` and
``python -m bench segments`` run exactly what ``python -m collectives bench ...`` runs.
"""

import collectives.bench

__path__ = list(collectives.bench.__path__)
