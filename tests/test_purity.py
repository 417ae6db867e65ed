"""The pure layer imports no MPI, GPU or torch library."""

import subprocess
import sys

PURE = [
    "collectives.schedule",
    "collectives.chunking",
    "collectives.memo",
    "collectives.specs",
    "collectives.ops",
    "collectives.algorithms",
    "collectives.algorithms.base",
    "collectives.algorithms.butterfly",
    "collectives.algorithms.halving_doubling",
    "collectives.algorithms.ring",
    "collectives.algorithms.tree",
    "collectives.algorithms.double_tree",
    "collectives.algorithms.multi_ring",
    "collectives.algorithms.hierarchical",
    "collectives.algorithms.direct",
    "collectives.algorithms.dissemination",
    "collectives.simulate",
    "collectives.selector",
    "collectives.ordering",
    "collectives.calibration",
    "collectives.explanation",
    "collectives.topology",
    "collectives.topology.cost_model",
    "collectives.topology.strategies",
    "collectives.kvstore.layout",
]


def test_pure_modules_and_the_package_import_no_mpi_gpu_or_torch() -> None:
    code = (
        "import sys\n"
        f"for name in {PURE!r} + ['collectives']:\n"
        "    __import__(name)\n"
        "from collectives.algorithms import build_schedule\n"
        "from collectives.simulate import simulate\n"
        "simulate(build_schedule('allreduce', 'ring', 4, 10))\n"
        "simulate(build_schedule('allreduce', 'double_tree', 5, 100_000))\n"
        "import collectives\n"
        "from collectives.selector import default_selector\n"
        "default_selector(4).choose('allreduce', 4, 10, 4)\n"
        "print(collectives.explain('allreduce', 10, world_size=4))\n"
        "from collectives.topology import dgx1, pack_rings\n"
        "from collectives.topology.link_model import predict\n"
        "predict(build_schedule('allreduce', 'multi_ring', 8, 10), dgx1(), 4)\n"
        "pack_rings(dgx1())\n"
        "print(sorted(m for m in ('mpi4py', 'cupy', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_mpi4py_is_imported_only_by_the_mpi_transport_and_the_benchmarks() -> None:
    from pathlib import Path

    import collectives

    package = Path(collectives.__file__).parent
    # module-level imports only: annotations may name mpi4py under TYPE_CHECKING
    importers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(line.startswith(("import mpi4py", "from mpi4py")) for line in path.read_text().splitlines())
    )
    # the benchmarks time the MPI library's own collectives beside ours, and launch as MPI programs
    assert importers and all(path.startswith(("transport/mpi/", "bench/")) for path in importers), importers
    assert any(path.startswith("transport/mpi/") for path in importers)


def test_topology_imports_only_the_schedule_layer() -> None:
    # DESIGN.md: topology/ may import schedule (and what schedule stands on), so algorithms may import it
    import re
    from pathlib import Path

    import collectives

    package = Path(collectives.__file__).parent / "topology"
    imported = {
        match
        for path in package.glob("*.py")
        for match in re.findall(r"^from \.\.(\w+)", path.read_text(), flags=re.MULTILINE)
    }
    assert imported <= {"schedule", "chunking", "errors"}


def test_numpy_collectives_never_import_cupy() -> None:
    # the CuPy backend is chosen only for arrays that look like device arrays
    code = (
        "import sys\n"
        "import numpy as np\n"
        "import collectives as C\n"
        "from collectives.transport.loopback import LoopbackWorld\n"
        "LoopbackWorld(2).run(lambda t: C.allreduce(np.ones(4), comm=C.Communicator(t)))\n"
        "C.backends.backend_for(np.ones(2))\n"
        "print('cupy' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "False"
