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


# A private attribute is its class's business. ``x._name`` (read, written or deleted; ``getattr(x, "_name")``
# too) is allowed on ``self`` and ``cls``, and on another object only inside a class that defines ``_name``
# itself (another instance of the same class: ``other._key`` in ``__eq__``). Everyone else goes through
# what the object offers: a method, a property, a constructor. Module-level functions and other classes of
# the same module are "everyone else": a module is not a friend of its classes' insides. Not ours to judge:
# names the package defines nowhere (torch's ``tensor._values()``, a namedtuple's ``_replace``) and
# attributes of an imported third-party module (``torch._C``, ``sys._getframe``).
_PRIVATE = re.compile(r"^_[^_]|^_$")


def _class_names(node: ast.ClassDef) -> set[str]:
    """The private names a class defines: in its body, and as ``self._x = ...`` / ``cls._x = ...``."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Assign | ast.AnnAssign):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(item.value, ast.Tuple | ast.List) and getattr(target, "id", "") == "__slots__":
                    names |= {e.value for e in item.value.elts if isinstance(e, ast.Constant)}
    for inner in ast.walk(node):
        if (
            isinstance(inner, ast.Attribute)
            and isinstance(inner.ctx, ast.Store)
            and isinstance(inner.value, ast.Name)
            and inner.value.id in ("self", "cls")
        ):
            names.add(inner.attr)
    return {n for n in names if _PRIVATE.match(n)}


def _module_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: its classes' and its own top level's."""
    names = set().union(*(_class_names(n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)))
    for item in tree.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Assign | ast.AnnAssign):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return {n for n in names if _PRIVATE.match(n)}


def _third_party_names(tree: ast.Module) -> set[str]:
    """The names a module binds to third-party imports (``torch``, ``MPI``, ``sys``)."""

    def ours(module: str) -> bool:
        return module == "collectives" or module.startswith("collectives.")

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not ours(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and not ours(node.module or ""):
            names |= {a.asname or a.name for a in node.names}
    return names


def _reached(node: ast.AST) -> tuple[ast.expr, str] | None:
    """The object and attribute name of ``x._name``, ``getattr(x, "_name")``, ``setattr`` ..., if one."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _reaching_in(tree: ast.Module, ours: set[str]) -> set[str]:
    """The ``x._name`` of a module where ``_name`` is one of ``ours`` and no class around it defines it."""
    third_party = _third_party_names(tree)
    found: set[str] = set()
    todo: list[tuple[ast.AST, frozenset[str]]] = [(tree, frozenset())]
    while todo:
        node, owned = todo.pop()
        if isinstance(node, ast.ClassDef):
            owned = owned | _class_names(node)
        reached = _reached(node)
        if reached is not None and _PRIVATE.match(reached[1]) and reached[1] in ours - owned:
            holder, root = reached[0], reached[0]
            while isinstance(root, ast.Attribute | ast.Subscript):
                root = root.value
            if not (isinstance(holder, ast.Name) and holder.id in ("self", "cls")) and not (
                isinstance(root, ast.Name) and root.id in third_party
            ):
                found.add(f"{ast.unparse(holder)}.{reached[1]}")
        todo.extend((child, owned) for child in ast.iter_child_nodes(node))
    return found


def _private_attributes(modules: dict[str, Path] = MODULES) -> dict[str, set[str]]:
    """Per module, the ``x._name`` it reaches into from outside the class that defines ``_name``."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    ours = set().union(*(_module_names(tree) for tree in trees.values()))
    found = {name.removeprefix("collectives."): _reaching_in(tree, ours) for name, tree in trees.items()}
    return {name: reached for name, reached in found.items() if reached}


# Each one explained; the test fails on a new one, and on one that is gone but still listed.
KNOWN_PRIVATE_ATTRIBUTES: dict[str, set[str]] = {}


def test_no_module_reaches_into_another_objects_underscore_attributes() -> None:
    assert _private_attributes() == KNOWN_PRIVATE_ATTRIBUTES


def test_the_attribute_checker_sees_reaching_in(tmp_path: Path) -> None:
    owner = tmp_path / "owner.py"
    owner.write_text(
        "import torch\n"
        "class Box:\n"
        "    _limit = 3\n"
        "    def __init__(self):\n"
        "        self._inner = 1\n"
        "    def __eq__(self, other):\n"
        "        return self._inner == other._inner and type(self)._limit\n"  # the same class: its business
        "def peek(box):\n"
        "    return box._inner, torch._C, box.tensor._values()\n"  # a module's own function reaches in
    )
    user = tmp_path / "user.py"
    user.write_text(
        "def build(store, box):\n"
        "    store._link.server = None\n"  # written through a chain
        "    return getattr(box, '_limit'), store.public, store._unknown\n"
    )
    found = _private_attributes({"collectives.owner": owner, "collectives.user": user, **MODULES})
    assert found == {"owner": {"box._inner"}, "user": {"store._link", "box._limit"}}


def _class_places(modules: dict[str, Path] = MODULES) -> dict[str, set[str]]:
    """Each class name defined in two modules or more, and those modules (nested classes too)."""
    places: dict[str, set[str]] = {}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                places.setdefault(node.name, set()).add(name.removeprefix("collectives."))
    return {cls: where for cls, where in places.items() if len(where) > 1}


# Public names used twice, each the name its users know from the library it follows; a name used
# twice inside the package says too little of what it holds, so it gets a name of its own instead.
PUBLIC_PAIRS: dict[str, set[str]] = {
    # torch_integration.Handle: a tensor collective in flight (Horovod's handle); kvstore.Handle: a
    # push or pull in flight (ps-lite's timestamp to wait on). Each is its package's public name.
    "Handle": {"torch_integration.mpi_ops", "kvstore.handles"},
}


def test_no_two_classes_share_a_name_but_the_public_pairs_listed() -> None:
    assert _class_places() == PUBLIC_PAIRS


def test_the_class_name_checker_sees_a_name_used_twice(tmp_path: Path) -> None:
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("class Row:\n    class State:\n        pass\n")
    second.write_text("def f():\n    class State:\n        pass\n    return State\n")
    found = _class_places({"collectives.first": first, "collectives.second": second})
    assert found == {"State": {"first", "second"}}
