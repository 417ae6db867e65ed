"""docs/architecture.md against the code: every module has a row, and imports only what its row allows."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "collectives"
LONGEST = 650  # "about 600 lines": a module past it likely holds two concerns
ROW = re.compile(r"^\| `(collectives/[\w/]+\.py)` \| [^|]+ \| ([^|]+) \|$", re.MULTILINE)


def _modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of the package that ``name`` imports (annotations-only imports too), without the prefix."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # "from . import x" and "from .algorithms import base" name modules; else the module itself
            candidates = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
            candidates = candidates or [base]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in MODULES and c != name}
    return {module.removeprefix("collectives.") for module in found}


def _rows() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for path, allowed in ROW.findall(text):
        name = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        rows[name] = set() if allowed.strip() == "-" else {a.strip() for a in allowed.split(",")}
    return rows


ROWS = _rows()


def test_every_module_has_a_row_and_every_row_a_module() -> None:
    assert sorted(ROWS) == sorted(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_only_what_its_row_allows(name: str) -> None:
    allowed = ROWS.get(name, set())

    def permitted(module: str) -> bool:
        # an entry covers itself and the modules under it ("topology" allows "topology.graph")
        return any(module == entry or module.startswith(entry + ".") for entry in allowed)

    assert sorted(m for m in _imports(name, MODULES[name]) if not permitted(m)) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_opens_with_a_one_line_docstring_and_stays_short(name: str) -> None:
    source = MODULES[name].read_text()
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring, f"{name} has no docstring"
    first = docstring.splitlines()[0]
    assert first.endswith(".") and len(first) <= 110, first
    assert source.count("\n") <= LONGEST, f"{name}: {source.count(chr(10))} lines"


def _imports_of(name: str) -> set[str]:
    return _imports(f"collectives.{name}", MODULES[f"collectives.{name}"])


def test_the_checker_sees_imports() -> None:
    # relative imports of modules and of names, and "from .. import module"
    assert {"errors", "transport.base"} <= _imports_of("transport.mpi.messages")
    assert "algorithms.base" in _imports_of("algorithms.ring")
    assert "communicator" in _imports_of("dispatch")
    assert "api" in _imports_of("torch_integration.functional")
