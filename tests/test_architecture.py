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


def _graph() -> dict[str, set[str]]:
    return {name.removeprefix("collectives."): _imports(name, path) for name, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The import circles: groups of two or more modules that reach each other (imports in functions too)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == module:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _private_imports(modules: dict[str, Path] = MODULES) -> dict[str, set[str]]:
    """Per module, the underscore names it imports from other modules of the package."""
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base != "collectives" and not base.startswith("collectives."):
                continue  # a third party's private names are its business
            private = {a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
            if private:
                found.setdefault(name.removeprefix("collectives."), set()).update(private)
    return found


# What issue 28 is to remove; each test fails on a new one, and on one that is gone but still listed.
KNOWN_CIRCLES: set[frozenset[str]] = set()
KNOWN_PRIVATE_IMPORTS: dict[str, set[str]] = {}


def test_no_module_joins_an_import_circle() -> None:
    assert _circles(_graph()) == KNOWN_CIRCLES


def test_no_module_imports_another_modules_underscore_names() -> None:
    assert _private_imports() == KNOWN_PRIVATE_IMPORTS


def test_the_checkers_see_circles_and_private_names(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert _circles(graph) == {frozenset("abc")}
    assert _circles({**graph, "d": {"e"}, "e": {"d"}}) == {frozenset("abc"), frozenset("de")}
    sibling = tmp_path / "named.py"
    sibling.write_text("from .worker import _worker, worker\nfrom numpy import _private\n")
    found = _private_imports({"collectives.torch_integration.named": sibling})
    assert found == {"torch_integration.named": {"_worker"}}  # a sibling module's, not a third party's


def _work_in(tree: ast.Module) -> list[str]:
    """What a module's top level does besides its docstring, ``__all__``, ``__version__`` and imports."""
    plain = (ast.Import, ast.ImportFrom, ast.Expr)
    named = {"__all__", "__version__"}
    return [
        f"line {node.lineno}: {type(node).__name__}"
        for node in tree.body
        if not isinstance(node, plain)
        and not (isinstance(node, ast.Assign) and {getattr(t, "id", "") for t in node.targets} <= named)
    ]


@pytest.mark.parametrize("name", sorted(n for n, p in MODULES.items() if p.name == "__init__.py"))
def test_a_package_init_hands_names_on_and_does_no_work(name: str) -> None:
    assert _work_in(ast.parse(MODULES[name].read_text())) == []


def test_the_init_checker_sees_work() -> None:
    tree = ast.parse('"""Doc."""\n__all__ = ["f"]\nfrom .a import f\n_cache = {}\ndef g():\n    pass\n')
    assert _work_in(tree) == ["line 4: Assign", "line 5: FunctionDef"]


def _bench_graph() -> dict[str, set[str]]:
    """collectives/bench/'s modules and the bench modules each imports (inside functions too)."""
    names = {path.stem for path in (PACKAGE / "bench").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in names:
        found: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / "bench" / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module} if node.module else {alias.name for alias in node.names}
        graph[name] = (found & names) - {name}
    return graph


def test_no_bench_module_joins_an_import_circle() -> None:
    graph = _bench_graph()
    assert "table" in graph["compare_report"]  # the checker sees bench's imports
    assert _circles(graph) == set()
