"""The pure layer imports no MPI, GPU or torch library."""

import subprocess
import sys

PURE = [
    "collectives.schedule",
    "collectives.chunking",
    "collectives.specs",
    "collectives.ops",
    "collectives.algorithms",
    "collectives.algorithms.ring",
    "collectives.algorithms.direct",
    "collectives.algorithms.dissemination",
    "collectives.simulate",
]


def test_pure_modules_and_the_package_import_no_mpi_gpu_or_torch() -> None:
    code = (
        "import sys\n"
        f"for name in {PURE!r} + ['collectives']:\n"
        "    __import__(name)\n"
        "from collectives.algorithms import build_schedule\n"
        "from collectives.simulate import simulate\n"
        "simulate(build_schedule('allreduce', 'ring', 4, 10))\n"
        "print(sorted(m for m in ('mpi4py', 'cupy', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_mpi4py_is_imported_only_by_the_mpi_transport() -> None:
    from pathlib import Path

    import collectives

    package = Path(collectives.__file__).parent
    # module-level imports only: annotations may name mpi4py under TYPE_CHECKING
    importers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(line.startswith(("import mpi4py", "from mpi4py")) for line in path.read_text().splitlines())
    )
    assert importers == ["transport/mpi.py"]
