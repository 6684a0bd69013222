"""The package's import rules, checked over the source with `ast` (nothing is imported).

(a) Layers: imports point one way, from a higher layer to a lower one or within one layer. The
layers, lowest first: events, projections, ports, streams.logs, streams.kafka,
streams.publishing, streams.runtime, streams.web, streams.worker, streams.tools, streams.cli.
Inside projections, lowest first: store and jsjson, then pruning, then views and ledger (two
peers that must not import each other; ledger.commands uses pruning's digest), then folds.
The root packages `sessionfold` and `sessionfold.streams` hold no code and belong to no layer.

(b) Surfaces: a module outside a package imports only the modules its `__init__.py` lists in
`__all__`; the other modules are private to the package. This holds at every level: importing
`a.b.c` from outside `a` needs `b` in `a.__all__` and, from outside `a.b`, `c` in `a.b.__all__`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "sessionfold"

# (layer, rank, unit) by module prefix; the longest prefix wins. Equal ranks in different units
# are peers and may not import each other.
LAYERS: dict[str, tuple[int, int, str]] = {
    "sessionfold.events": (0, 0, "events"),
    "sessionfold.projections.store": (1, 0, "projections.core"),
    "sessionfold.projections.jsjson": (1, 0, "projections.core"),
    "sessionfold.projections.text_lines": (1, 0, "projections.core"),
    "sessionfold.projections.pruning": (1, 1, "projections.pruning"),
    "sessionfold.projections.views": (1, 2, "projections.views"),
    "sessionfold.projections.ledger": (1, 2, "projections.ledger"),
    "sessionfold.projections.folds": (1, 3, "projections.folds"),
    "sessionfold.ports": (2, 0, "ports"),
    "sessionfold.streams.logs": (3, 0, "streams.logs"),
    "sessionfold.streams.private_dirs": (3, 0, "streams.private_dirs"),
    "sessionfold.streams.kafka": (4, 0, "streams.kafka"),
    "sessionfold.streams.publishing": (5, 0, "streams.publishing"),
    "sessionfold.streams.runtime": (6, 0, "streams.runtime"),
    "sessionfold.streams.web": (7, 0, "streams.web"),
    "sessionfold.streams.worker": (8, 0, "streams.worker"),
    "sessionfold.streams.tools": (9, 0, "streams.tools"),
    "sessionfold.streams.cli": (10, 0, "streams.cli"),
}
ROOTS = {"sessionfold", "sessionfold.streams"}


@dataclass(frozen=True)
class Import:
    """One import of a sessionfold module: who imports it, where, and the module imported."""

    importer: str
    path: Path
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.module}"


def module_paths(source: Path) -> dict[str, Path]:
    """Map every module and package under `source` (the `sessionfold` directory) to its file."""
    modules = {}
    for path in sorted(source.rglob("*.py")):
        parts = [source.name, *path.relative_to(source).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(source: Path) -> list[Import]:
    """Every import of a sessionfold module in the source; `from p import m` counts as `p.m`."""
    modules = module_paths(source)
    found = []
    for importer, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.append(full if full in modules else node.module)
            found += [
                Import(importer, path.relative_to(source.parent), node.lineno, target)
                for target in dict.fromkeys(targets)
                if target.split(".")[0] == source.name
            ]
    return found


def layer_of(module: str) -> tuple[int, int, str] | None:
    """The (layer, rank, unit) of a module, or None for the root packages."""
    if module in ROOTS:
        return None
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    if not prefixes:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
    return LAYERS[max(prefixes, key=len)]


def layer_violations(source: Path) -> list[str]:
    """The imports that point from a lower layer (or a peer unit) to a higher one."""
    bad = []
    for imp in imports_of(source):
        low, high = layer_of(imp.module), layer_of(imp.importer)
        if low is None or high is None or low[2] == high[2]:
            continue
        if low[:2] >= high[:2]:
            bad.append(f"{imp} (a higher layer or a peer)")
    return bad


def declared_all(init: Path) -> list[str] | None:
    """The names in a package's literal `__all__`, or None when it has none."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return None


def surface_violations(source: Path) -> list[str]:
    """The imports that reach, from outside a package, a module its `__all__` does not list."""
    modules = module_paths(source)
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    bad = []
    for imp in imports_of(source):
        parts = imp.module.split(".")
        for depth in range(1, len(parts)):
            package, child = ".".join(parts[:depth]), parts[depth]
            inside = imp.importer == package or imp.importer.startswith(package + ".")
            if package not in packages or inside:
                continue
            public = declared_all(modules[package]) or []
            if child not in public:
                bad.append(f"{imp}, but {package}.__all__ does not list {child!r}")
    return bad


def test_imports_point_down_the_layers() -> None:
    """No module imports from a higher layer, nor from a peer unit inside projections."""
    assert layer_violations(SOURCE) == []


def test_imports_from_outside_a_package_use_its_public_modules() -> None:
    """Every import from outside a package names a module the package's `__all__` lists."""
    assert surface_violations(SOURCE) == []


def _defined_names(init: Path) -> set[str]:
    """The functions, classes and assigned names at the top of an `__init__.py`."""
    names = set()
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_package_declares_its_public_modules() -> None:
    """Each package has an `__all__` naming only its modules or names its `__init__` defines."""
    modules = module_paths(SOURCE)
    for package, init in modules.items():
        if init.name != "__init__.py":
            continue
        public = declared_all(init)
        assert public is not None, f"{package} has no __all__"
        unknown = [
            name
            for name in public
            if f"{package}.{name}" not in modules and name not in _defined_names(init)
        ]
        assert unknown == [], f"{package}.__all__ names what it does not hold"


def _tree(root: Path, files: dict[str, str]) -> Path:
    """Write a small `sessionfold` tree under `root` and return its source directory."""
    for name, text in files.items():
        path = root / "sessionfold" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "sessionfold"


@pytest.mark.parametrize(
    ("importer", "line"),
    [
        ("events/envelope.py", "from sessionfold.ports import model_http\n"),
        ("projections/pruning/digest.py", "from sessionfold.projections.views import base\n"),
        ("projections/views/base.py", "import sessionfold.projections.ledger.state\n"),
        ("streams/kafka/topics.py", "from sessionfold.streams.cli.options import X\n"),
    ],
)
def test_a_wrong_import_is_named(tmp_path: Path, importer: str, line: str) -> None:
    """An upward (or peer) import in a small tree is reported with its module and line."""
    files = {
        "__init__.py": "",
        "events/__init__.py": "__all__ = ['envelope']\n",
        "events/envelope.py": "",
        "ports/__init__.py": "__all__ = ['model_http']\n",
        "ports/model_http.py": "from sessionfold.events import envelope\n",
        "projections/__init__.py": "__all__ = ['pruning', 'views', 'ledger']\n",
        "projections/pruning/__init__.py": "__all__ = ['digest']\n",
        "projections/pruning/digest.py": "",
        "projections/views/__init__.py": "__all__ = ['base']\n",
        "projections/views/base.py": "from sessionfold.projections.pruning import digest\n",
        "projections/ledger/__init__.py": "__all__ = ['state']\n",
        "projections/ledger/state.py": "from sessionfold.projections.pruning.digest import D\n",
        "streams/__init__.py": "__all__ = ['kafka', 'cli']\n",
        "streams/kafka/__init__.py": "__all__ = ['topics']\n",
        "streams/kafka/topics.py": "",
        "streams/cli/__init__.py": "__all__ = ['options']\n",
        "streams/cli/options.py": "from sessionfold.streams.kafka import topics\n",
    }
    source = _tree(tmp_path, files)
    assert layer_violations(source) == []
    (source / importer).write_text(line, encoding="utf-8")
    violations = layer_violations(source)
    assert len(violations) == 1
    assert f"sessionfold/{importer}:1:" in violations[0]
    assert line.split()[1] in violations[0]


def test_an_import_of_a_private_module_is_named(tmp_path: Path) -> None:
    """Importing a module its package's `__all__` leaves out is reported, naming both."""
    files = {
        "__init__.py": "",
        "events/__init__.py": "__all__ = ['envelope']\n",
        "events/envelope.py": "from sessionfold.events import lines\n",
        "events/lines.py": "",
        "ports/__init__.py": "__all__ = ['model_http']\n",
        "ports/model_http.py": "from sessionfold.events.envelope import E\n",
    }
    source = _tree(tmp_path, files)
    assert surface_violations(source) == []
    (source / "ports/model_http.py").write_text("from sessionfold.events.lines import L\n")
    assert surface_violations(source) == [
        "sessionfold/ports/model_http.py:1: sessionfold.ports.model_http imports "
        "sessionfold.events.lines, but sessionfold.events.__all__ does not list 'lines'"
    ]


def import_cycles(source: Path) -> list[list[str]]:
    """Each cycle of module imports (a function's own imports count too), once, as a path that
    starts and ends at its smallest module."""
    graph: dict[str, set[str]] = {}
    for imp in imports_of(source):
        if imp.module != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.module)
    cycles: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                cycles.add((*path, nxt))
            elif nxt > path[0] and nxt not in path:
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return [list(cycle) for cycle in sorted(cycles)]


def test_no_module_imports_itself_through_others() -> None:
    assert import_cycles(SOURCE) == []


def test_an_import_cycle_is_named(tmp_path: Path) -> None:
    source = tmp_path / "sessionfold"
    (source / "streams" / "cli").mkdir(parents=True)
    for name in ("__init__.py", "streams/__init__.py", "streams/cli/__init__.py"):
        (source / name).write_text("")
    (source / "streams/cli/a.py").write_text(
        "def f():\n    from sessionfold.streams.cli import b\n"
    )
    (source / "streams/cli/b.py").write_text("from sessionfold.streams.cli.a import f\n")
    expected = [
        "sessionfold.streams.cli.a",
        "sessionfold.streams.cli.b",
        "sessionfold.streams.cli.a",
    ]
    assert import_cycles(source) == [expected]
