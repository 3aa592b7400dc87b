"""The drawing of the house: a static picture of the package's modules and of the imports between them.

Usage::

    python tools/house.py [--root DIR] [--out FILE] [--closure MODULE ...] [--walk-command NAME]
                          [--walk-start MODULE:FUNCTION] [--no-runtime]

``--root`` is the repository (default: the one holding this file); the markdown goes to stdout or
``--out``. Nothing of the package is executed except the one runtime check of the closure (a subprocess
that imports each ``--closure`` module with the current interpreter and environment; ``--no-runtime``
skips it). Everything else is read with ``ast``.

What is read:

* **modules** — every ``*.py`` under the folders of ``[tool.setuptools] package-dir`` in
  ``pyproject.toml`` (a folder under two entries belongs to the longer one), named by the package it
  installs as (``envs/clevr/env.py`` -> ``imaginejax.envs.clevr.env``; ``__init__.py`` is its package).
* **floors and rooms** — a floor is a folder (a package), its rooms the modules in it, each with its
  line count (lines of the file, as ``wc -l`` counts them up to a last line without a newline).
* **imports** — every ``import`` / ``from ... import`` of a module of the package, top-level and
  function-local; ``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg``;
  relative imports are resolved. An import is *load-time* when it runs when its module is imported:
  outside every function body and outside ``if TYPE_CHECKING:`` (class bodies and module-level
  ``try``/``if`` run). An *edge* is one (importer, imported) pair, listed with the lines that make it.
* **layers** — ``LAYERS`` and ``ROOT_PACKAGE`` of ``tests/test_layers.py`` (read as literals; a table
  that is no literal is read by importing that file), the
  table of ``docs/architecture.md``: a module's rank is that of its longest matching prefix.

The numbers:

* **module cycles** — strongly connected components (Tarjan) of more than one module of the import graph,
  once over all imports and once over load-time imports only; each with its members and the edges
  between members (the edges that close it).
* **folder cycles** — pairs of floors A, B where a module of A imports one of B and a module of B imports
  one of A (with the edges of each direction), and the strongly connected components of the floor graph
  of more than two floors.
* **arrows running back up** — imports from a module of rank r to a module of a higher rank, per rank.
* **closure of M** — the modules ``import M`` executes, statically: M, the packages above it, and
  transitively every load-time import of those, with each reached module's packages. Reported as files
  and lines; the runtime check counts the package's modules in ``sys.modules`` after ``import M`` in a
  fresh interpreter and lists the modules only one of the two counts has. Also counted: the closure
  through function-local imports too (what calling every function reached could import).
* **the walk of a configuration** — a static call-graph walk from the function that handles
  ``<script> train`` (the entry point of ``[project.scripts]``'s first script: the module's dict literal
  whose key ``"train"`` maps to a function, else a function named ``_train`` / ``train`` there; or
  ``--walk-start``). Each function's calls are taken in evaluation order (by where each call ends, so
  ``f(g())`` calls ``g`` first), and the walk descends depth-first into every call that resolves to a
  function of the package; a function already walked is not walked again. A call resolves through the
  function's local names (nested ``def``, local imports, local variables assigned from a class or from a
  function whose return annotation is a class, parameters annotated with a class, ``self``/``cls``), then
  the module's ``def``/``class`` and imports, following re-exports (``from .io import load_dataset`` in a
  package ``__init__``) and module attributes (``bench.train``, ``imaginejax.bench.train``). ``Cls(...)``
  walks ``Cls.__init__`` / ``__post_init__`` when the class defines them; ``obj.method(...)`` resolves
  when ``obj``'s class is known as above (methods are looked up along the package's base classes). A
  function of the package passed as an argument (``jax.jit(step)``, ``log=_log``) counts as called there.
  The reader's position is a sequence of files: entering a callee moves to its file, finishing it moves
  back to the caller's; consecutive repeats collapse.

  - *files entered*: distinct files in that sequence;
  - *file switches*: moves in the collapsed sequence (its length - 1);
  - *returns*: moves to a file already seen earlier in the sequence (= switches - files entered + 1);
  - *climbs back up*: distinct call edges (caller function -> callee function) of the walk whose callee's
    module has a higher layer rank than the caller's;
  - *functions taking the whole Config*: functions (walked, and every function of the package) with a
    parameter annotated ``Config`` (the class named ``Config`` of the package; ``Config | None`` and
    ``"Config"`` count), listed per file; parameters named ``config``/``cfg`` without annotation are
    listed apart as *maybe*.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE_ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------- modules


def package_dirs(root: Path) -> dict[str, str]:
    """Source folder (relative to root) -> the package it installs as, from pyproject's package-dir."""
    data = tomllib.loads((Path(root) / "pyproject.toml").read_text())
    mapping = data.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not mapping:
        raise LookupError(f"{root}/pyproject.toml has no [tool.setuptools] package-dir")
    return {folder.rstrip("/") or ".": package for package, folder in mapping.items()}


def root_package(root: Path) -> str:
    """The top-level package every package-dir entry lies under (its shortest name)."""
    return min(package_dirs(root).values(), key=len).split(".")[0]


def source_modules(root: Path = HERE_ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the installed package (pyproject's package-dir)."""
    root = Path(root)
    dirs = package_dirs(root)
    modules: dict[str, Path] = {}
    for folder in sorted(dirs):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            # The folder of the longest package-dir entry that holds the file names it.
            owner = max((f for f in dirs if f == "." or rel.startswith(f + "/")), key=len)
            if owner != folder:
                continue
            parts = path.relative_to(root / folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            name = ".".join((dirs[folder], *parts))
            modules[name.removesuffix(".__init__")] = path
    return dict(sorted(modules.items()))


@dataclass(frozen=True)
class Import:
    line: int
    target: str
    local: bool  # inside a function body
    type_checking: bool  # inside ``if TYPE_CHECKING:``

    @property
    def load_time(self) -> bool:
        return not self.local and not self.type_checking


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve_from(package: str, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        anchor = parts[: len(parts) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return base


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str, path: Path, known: set[str], top: str | None = None,
            tree: ast.Module | None = None) -> list[Import]:
    """Every import of a module of the package ``top`` (default: the first part of ``module``) in a file."""
    top = top or module.split(".")[0]
    package = _package_of(module, path)
    tree = tree or ast.parse(Path(path).read_text(), str(path))
    found: set[Import] = set()

    def visit(node: ast.AST, local: bool, checking: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(Import(node.lineno, alias.name, local, checking))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(package, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(Import(node.lineno, sub if sub in known else base, local, checking))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, local, True)
            for child in node.orelse:
                visit(child, local, checking)
            return
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner, checking)

    visit(tree, False, False)
    return sorted((i for i in found if i.target.split(".")[0] == top), key=lambda i: (i.line, i.target))


def imported_modules(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, dotted target) of every import of the module's own top-level package in a file, function-local
    ones included; ``from package import name`` counts as importing ``package.name`` when that is a module."""
    return sorted({(i.line, i.target) for i in imports(module, path, known)})


# ---------------------------------------------------------------------------------------------- layers


def read_layers(root: Path) -> tuple[tuple, str]:
    """(LAYERS, ROOT_PACKAGE) of ``tests/test_layers.py``: read as literals (nothing is executed), or, where
    the table is no literal, by importing that file."""
    path = Path(root) / "tests" / "test_layers.py"
    values = {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id in ("LAYERS", "ROOT_PACKAGE") and node.value is not None:
            try:
                values[target.id] = ast.literal_eval(node.value)
            except ValueError:
                values.clear()
                break
    if "LAYERS" not in values:
        import importlib.util

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        spec = importlib.util.spec_from_file_location("_house_test_layers", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        values = {"LAYERS": module.LAYERS, "ROOT_PACKAGE": getattr(module, "ROOT_PACKAGE", None)}
    return tuple(values["LAYERS"]), values.get("ROOT_PACKAGE") or root_package(root)


def layer_of(module: str, layers, root_pkg: str) -> tuple[int, str]:
    """(rank, layer name) of a dotted module name, by its longest prefix in ``layers``.

    ``layers`` is a sequence of (rank, name, prefixes); the root package's prefix names only its own
    ``__init__``, so a new top-level module needs its own entry."""
    best: tuple[int, int, str] = (-1, -1, "")
    for rank, name, prefixes in layers:
        for prefix in prefixes:
            covers = module == prefix or (prefix != root_pkg and module.startswith(prefix + "."))
            if covers and len(prefix) > best[0]:
                best = (len(prefix), rank, name)
    if best[0] < 0:
        raise LookupError(f"{module} is in no layer of tests/test_layers.py LAYERS; add its prefix there")
    return best[1], best[2]


# -------------------------------------------------------------------------------------------- the house


@dataclass
class House:
    root: Path
    top: str
    modules: dict[str, Path]
    lines: dict[str, int]
    trees: dict[str, ast.Module]
    imports: dict[str, list[Import]]
    layers: tuple = ()
    root_pkg: str = ""

    @classmethod
    def read(cls, root: Path, layers=None, root_pkg: str | None = None) -> House:
        root = Path(root).resolve()
        modules = source_modules(root)
        top = root_package(root)
        trees, lines, found = {}, {}, {}
        for name, path in modules.items():
            text = path.read_text()
            trees[name] = ast.parse(text, str(path))
            lines[name] = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            found[name] = imports(name, path, set(modules), top, trees[name])
        if layers is None:
            try:
                layers, root_pkg = read_layers(root)
            except (OSError, LookupError, ValueError):
                layers, root_pkg = (), top
        return cls(root, top, modules, lines, trees, found, tuple(layers), root_pkg or top)

    # -- helpers
    def rel(self, module: str) -> str:
        return self.modules[module].relative_to(self.root).as_posix()

    def floor(self, module: str) -> str:
        """The package (folder) a module lies in."""
        return _package_of(module, self.modules[module])

    def floor_dir(self, floor: str) -> str:
        members = [m for m in self.modules if self.floor(m) == floor]
        return self.modules[members[0]].parent.relative_to(self.root).as_posix() if members else floor

    def rank(self, module: str) -> tuple[int, str] | None:
        if not self.layers:
            return None
        try:
            return layer_of(module, self.layers, self.root_pkg)
        except LookupError:
            return None

    def edges(self, load_time_only: bool = False) -> dict[tuple[str, str], list[Import]]:
        """(importer, imported) -> the imports making it; targets that are not modules of the package
        (e.g. a misspelt name) are kept as they are only if they are known modules."""
        out: dict[tuple[str, str], list[Import]] = defaultdict(list)
        for src, found in self.imports.items():
            for imp in found:
                target = self.known_target(imp.target)
                if target is None or target == src or (load_time_only and not imp.load_time):
                    continue
                out[(src, target)].append(imp)
        return dict(sorted(out.items()))

    def known_target(self, target: str) -> str | None:
        """The module an import target names: itself, or its longest known prefix (``import a.b.attr``)."""
        parts = target.split(".")
        while parts:
            name = ".".join(parts)
            if name in self.modules:
                return name
            parts.pop()
        return None

    # -- cycles
    def module_cycles(self, load_time_only: bool = False) -> list[tuple[list[str], list[tuple[str, str]]]]:
        edges = self.edges(load_time_only)
        graph = defaultdict(set)
        for a, b in edges:
            graph[a].add(b)
        out = []
        for comp in strongly_connected(list(self.modules), graph):
            if len(comp) > 1:
                members = set(comp)
                closing = [(a, b) for (a, b) in edges if a in members and b in members]
                out.append((sorted(comp), closing))
        return sorted(out, key=lambda c: (-len(c[0]), c[0]))

    def floor_edges(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        out: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
        for a, b in self.edges():
            fa, fb = self.floor(a), self.floor(b)
            if fa != fb:
                out[(fa, fb)].append((a, b))
        return dict(sorted(out.items()))

    def floor_cycles(self) -> tuple[list, list]:
        fe = self.floor_edges()
        pairs = [(a, b) for (a, b) in fe if a < b and (b, a) in fe]
        graph = defaultdict(set)
        for a, b in fe:
            graph[a].add(b)
        floors = sorted({self.floor(m) for m in self.modules})
        comps = [sorted(c) for c in strongly_connected(floors, graph) if len(c) > 2]
        return pairs, comps

    def upward(self) -> dict[int, list[tuple[str, str, Import]]]:
        out: dict[int, list] = defaultdict(list)
        for (a, b), found in self.edges().items():
            ra, rb = self.rank(a), self.rank(b)
            if ra is not None and rb is not None and rb[0] > ra[0]:
                for imp in found:
                    out[ra[0]].append((a, b, imp))
        return dict(sorted(out.items()))

    # -- closure
    def find_module(self, name: str) -> str:
        """A module by its dotted name, else by its last parts (``report`` -> ``imaginejax.report`` or, after
        a move, ``imaginejax.bench.report``) when exactly one module ends so."""
        if name in self.modules:
            return name
        found = [m for m in self.modules if m.endswith("." + name)]
        if len(found) != 1:
            raise SystemExit(f"--closure {name}: {'no module' if not found else 'several modules: ' + ', '.join(found)}"
                             " ends so; give the dotted name")
        return found[0]

    def ancestors(self, module: str) -> list[str]:
        parts = module.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in self.modules]

    def closure(self, module: str, load_time_only: bool = True) -> list[str]:
        """Modules that ``import module`` executes (load-time imports, with every package above each);
        ``load_time_only=False``: also through function-local imports (what running every function would
        import)."""
        if module not in self.modules:
            raise LookupError(f"{module} is no module of the package")
        edges = self.edges(load_time_only=load_time_only)
        graph = defaultdict(set)
        for a, b in edges:
            graph[a].add(b)
        seen: set[str] = set()
        todo = [module]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo += self.ancestors(m)
            todo += sorted(graph[m])
        return sorted(seen)

    def runtime_closure(self, module: str) -> dict:
        """``import module`` in a fresh interpreter (this one's executable and environment): the package's
        modules then in ``sys.modules`` and where the package was imported from."""
        code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); top = sys.argv[2]; "
                "print(json.dumps({'modules': sorted(m for m in sys.modules if m == top or m.startswith(top + '.')),"
                " 'file': sys.modules[top].__file__}))")
        proc = subprocess.run([sys.executable, "-c", code, module, self.top], capture_output=True, text=True,
                              cwd=self.root, timeout=600)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def strongly_connected(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                comps.append(comp)
    return comps


# --------------------------------------------------------------------------------------------- the walk

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Func:
    """A function or method of the package: ``qualname`` is ``f``, ``Cls.f`` or ``outer.<locals>.f``."""
    module: str
    qualname: str
    node: FunctionNode
    cls: str | None = None  # qualname of the class of a method
    parent: Func | None = None  # enclosing function of a nested def

    @property
    def key(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass
class ModuleIndex:
    functions: dict[str, Func] = field(default_factory=dict)  # top-level functions by name
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    methods: dict[tuple[str, str], Func] = field(default_factory=dict)  # (class, method) -> Func
    names: dict[str, str] = field(default_factory=dict)  # module-level import bindings: name -> dotted path
    bases: dict[str, list[ast.expr]] = field(default_factory=dict)


class Walker:
    """The static call-graph walk (see the module docstring)."""

    def __init__(self, house: House):
        self.house = house
        self.index: dict[str, ModuleIndex] = {m: self._index(m) for m in house.modules}

    # -- indexing
    def _index(self, module: str) -> ModuleIndex:
        idx = ModuleIndex()
        tree = self.house.trees[module]
        path = self.house.modules[module]
        for node in tree.body:
            for stmt in _flatten_module_level(node):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    idx.functions[stmt.name] = Func(module, stmt.name, stmt)
                elif isinstance(stmt, ast.ClassDef):
                    idx.classes[stmt.name] = stmt
                    idx.bases[stmt.name] = stmt.bases
                    for item in stmt.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            idx.methods[(stmt.name, item.name)] = Func(module, f"{stmt.name}.{item.name}", item,
                                                                        cls=stmt.name)
                elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    idx.names.update(self._bindings(module, path, stmt))
        return idx

    def _bindings(self, module: str, path: Path, node: ast.Import | ast.ImportFrom) -> dict[str, str]:
        out = {}
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    out[head] = head
        else:
            base = _resolve_from(_package_of(module, path), node)
            for alias in node.names:
                if alias.name != "*":
                    out[alias.asname or alias.name] = f"{base}.{alias.name}"
        return out

    # -- resolution of dotted paths to package objects
    def resolve_path(self, dotted: str, depth: int = 0) -> tuple[str, object] | None:
        """A dotted path -> ("module", name) | ("func", Func) | ("class", (module, name)), following
        re-exports of package modules."""
        if depth > 20 or not dotted:
            return None
        if dotted in self.house.modules:
            return ("module", dotted)
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            mod = ".".join(parts[:cut])
            if mod in self.house.modules:
                return self._attr_chain(("module", mod), parts[cut:], depth)
        return None

    def _attr_chain(self, obj, attrs: list[str], depth: int):
        for attr in attrs:
            if obj is None:
                return None
            obj = self._attr(obj, attr, depth)
        return obj

    def _attr(self, obj, attr: str, depth: int):
        kind, value = obj
        if kind == "module":
            idx = self.index[value]
            if attr in idx.functions:
                return ("func", idx.functions[attr])
            if attr in idx.classes:
                return ("class", (value, attr))
            if f"{value}.{attr}" in self.house.modules:
                return ("module", f"{value}.{attr}")
            if attr in idx.names:
                return self.resolve_path(idx.names[attr], depth + 1)
            return None
        if kind == "class":
            method = self.method(value, attr)
            return ("func", method) if method else None
        return None

    def method(self, cls: tuple[str, str], name: str, depth: int = 0) -> Func | None:
        """A method of a package class, looked up along its package base classes."""
        module, cname = cls
        idx = self.index[module]
        if (cname, name) in idx.methods:
            return idx.methods[(cname, name)]
        if depth > 10:
            return None
        for base in idx.bases.get(cname, []):
            found = self.resolve_expr(base, None, module)
            if found and found[0] == "class":
                m = self.method(found[1], name, depth + 1)
                if m:
                    return m
        return None

    def resolve_expr(self, expr: ast.expr, scope: Scope | None, module: str):
        """A Name / Attribute expression -> a package object, or None."""
        if isinstance(expr, ast.Name):
            if scope is not None:
                found = scope.lookup(expr.id)
                if found is not None:
                    return found
            idx = self.index[module]
            if expr.id in idx.functions:
                return ("func", idx.functions[expr.id])
            if expr.id in idx.classes:
                return ("class", (module, expr.id))
            if expr.id in idx.names:
                return self.resolve_path(idx.names[expr.id])
            return None
        if isinstance(expr, ast.Attribute):
            base = self.resolve_expr(expr.value, scope, module)
            if base is None:
                return None
            if base[0] == "instance":
                method = self.method(base[1], expr.attr)
                return ("func", method) if method else None
            return self._attr(base, expr.attr, 0)
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):  # a string annotation
            try:
                return self.resolve_expr(ast.parse(expr.value, mode="eval").body, scope, module)
            except SyntaxError:
                return None
        return None

    def annotation_class(self, ann: ast.expr | None, scope, module: str) -> tuple[str, str] | None:
        """The package class an annotation names (``Cls``, ``Cls | None``, ``Optional[Cls]``, ``"Cls"``)."""
        if ann is None:
            return None
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return self.annotation_class(ann.left, scope, module) or self.annotation_class(ann.right, scope, module)
        if isinstance(ann, ast.Subscript) and isinstance(ann.value, (ast.Name, ast.Attribute)) and \
                _last_name(ann.value) == "Optional":
            return self.annotation_class(ann.slice, scope, module)
        found = self.resolve_expr(ann, scope, module)
        return found[1] if found and found[0] == "class" else None

    # -- the walk
    def functions(self):
        for idx in self.index.values():
            yield from idx.functions.values()
            yield from idx.methods.values()

    def calls(self, func: Func) -> list[Func]:
        """The package functions a function calls, in evaluation order (by where each call ends)."""
        scope = Scope(self, func)
        events: list[tuple[tuple[int, int], int, Func]] = []

        def add(pos, order, target):
            if target is not None:
                events.append((pos, order, target))

        for node in _own_nodes(func.node):
            if isinstance(node, ast.Call):
                pos = (node.end_lineno or node.lineno, node.end_col_offset or 0)
                add(pos, 1, self._callee(node.func, scope, func.module))
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    if isinstance(arg, (ast.Name, ast.Attribute)):
                        found = self.resolve_expr(arg, scope, func.module)
                        if found and found[0] == "func":
                            add((arg.end_lineno or arg.lineno, arg.end_col_offset or 0), 0, found[1])
        out, seen = [], set()
        for _, _, target in sorted(events, key=lambda e: (e[0], e[1])):
            if target.key not in seen:
                seen.add(target.key)
                out.append(target)
        return out

    def _callee(self, expr: ast.expr, scope: Scope, module: str) -> Func | None:
        found = self.resolve_expr(expr, scope, module)
        if found is None:
            return None
        if found[0] == "func":
            return found[1]
        if found[0] == "class":
            return self.method(found[1], "__init__") or self.method(found[1], "__post_init__")
        return None

    def walk(self, start: Func) -> Walk:
        result = Walk(start=start)
        visited: set[str] = set()

        def visit(func: Func) -> None:
            visited.add(func.key)
            result.functions.append(func)
            for callee in self.calls(func):
                result.edges.add((func.key, callee.key))
                result.edge_funcs[(func.key, callee.key)] = (func, callee)
                if callee.key in visited:
                    continue
                result.positions.append(callee.module)
                visit(callee)
                result.positions.append(func.module)

        result.positions.append(start.module)
        sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
        visit(start)
        return result

    def takes_config(self, func: Func) -> tuple[list[str], list[str]]:
        """(parameters annotated Config, unannotated parameters named config/cfg)."""
        a = func.node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs] + [p for p in (a.vararg, a.kwarg) if p]
        sure, maybe = [], []
        scope = Scope(self, func.parent) if func.parent else None
        for p in params:
            cls = self.annotation_class(p.annotation, scope, func.module)
            if cls is not None and cls[1] == "Config":
                sure.append(p.arg)
            elif p.annotation is None and p.arg in ("config", "cfg"):
                maybe.append(p.arg)
            elif cls is None and p.annotation is not None and _annotation_text(p.annotation) in (
                    "Config", "Config | None", "Optional[Config]"):
                sure.append(p.arg)
        return sure, maybe


class Scope:
    """Local names of a function (and of the functions around it): nested defs, local imports,
    variables of a known class, annotated parameters, self/cls."""

    def __init__(self, walker: Walker, func: Func | None):
        self.names: dict[str, object] = {}
        self.outer = Scope(walker, func.parent) if func is not None and func.parent is not None else None
        if func is None:
            return
        module = func.module
        node = func.node
        path = walker.house.modules[module]
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        if func.cls is not None and params:
            first = params[0].arg
            decos = {_last_name(d) for d in node.decorator_list}
            if "staticmethod" not in decos:
                self.names[first] = ("class" if "classmethod" in decos else "instance", (module, func.cls))
        for stmt in _own_nodes(node):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for name, dotted in walker._bindings(module, path, stmt).items():
                    found = walker.resolve_path(dotted)
                    if found is not None:
                        self.names[name] = found
        for child in _own_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.names[child.name] = ("func", Func(module, f"{func.qualname}.<locals>.{child.name}", child,
                                                       cls=None, parent=func))
        for p in params:
            if p.arg in self.names:
                continue
            cls = walker.annotation_class(p.annotation, self, module)
            if cls is not None:
                self.names[p.arg] = ("instance", cls)
        for stmt in _own_nodes(node):
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Call):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if len(targets) != 1 or not isinstance(targets[0], ast.Name) or targets[0].id in self.names:
                    continue
                cls = None
                if isinstance(stmt, ast.AnnAssign):
                    cls = walker.annotation_class(stmt.annotation, self, module)
                if cls is None:
                    found = walker.resolve_expr(stmt.value.func, self, module)
                    if found and found[0] == "class":
                        cls = found[1]
                    elif found and found[0] == "func":
                        cls = walker.annotation_class(found[1].node.returns, None, found[1].module)
                if cls is not None:
                    self.names[targets[0].id] = ("instance", cls)

    def lookup(self, name: str):
        if name in self.names:
            return self.names[name]
        return self.outer.lookup(name) if self.outer else None


@dataclass
class Walk:
    start: Func
    functions: list[Func] = field(default_factory=list)
    positions: list[str] = field(default_factory=list)  # module of the reader after each move
    edges: set[tuple[str, str]] = field(default_factory=set)
    edge_funcs: dict[tuple[str, str], tuple[Func, Func]] = field(default_factory=dict)

    def sequence(self) -> list[str]:
        out: list[str] = []
        for m in self.positions:
            if not out or out[-1] != m:
                out.append(m)
        return out

    def numbers(self) -> dict[str, int]:
        seq = self.sequence()
        seen: set[str] = set()
        returns = 0
        for m in seq:
            returns += m in seen
            seen.add(m)
        return {"functions walked": len(self.functions), "files entered": len(seen),
                "file switches": len(seq) - 1, "returns": returns, "call edges": len(self.edges)}


def _last_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Call):
        return _last_name(expr.func)
    return ""


def _annotation_text(ann: ast.expr) -> str:
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return ann.value.strip()
    text = ast.unparse(ann)
    return text.rpartition(".")[2] if "." in text and "|" not in text and "[" not in text else text


def _flatten_module_level(node: ast.stmt):
    """Statements that run at module level: through if/try/with blocks, not into defs or classes."""
    if isinstance(node, (ast.If, ast.Try, ast.With)):
        for block in ("body", "orelse", "finalbody"):
            for child in getattr(node, block, []):
                yield from _flatten_module_level(child)
        for handler in getattr(node, "handlers", []):
            for child in handler.body:
                yield from _flatten_module_level(child)
    else:
        yield node


def _own_nodes(node: FunctionNode):
    """Nodes of a function's body, not entering nested defs / lambdas / classes (their header nodes,
    defaults and decorators included; nested defs themselves are yielded)."""
    todo = list(reversed([*node.body]))
    for d in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
        todo.append(d)
    while todo:
        current = todo.pop()
        yield current
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo += [*current.decorator_list]
            if not isinstance(current, ast.ClassDef):
                todo += [*current.args.defaults, *(d for d in current.args.kw_defaults if d is not None)]
            continue
        if isinstance(current, ast.Lambda):
            todo.append(current.body)  # a lambda's calls run where it is called; count them here
            continue
        todo += list(ast.iter_child_nodes(current))


def find_train_handler(house: House, walker: Walker, command: str = "train") -> Func:
    """The function handling ``<script> <command>``: from [project.scripts]' first entry point's module."""
    data = tomllib.loads((house.root / "pyproject.toml").read_text())
    scripts = data.get("project", {}).get("scripts", {})
    modules = [spec.split(":")[0] for spec in scripts.values()] or [f"{house.top}.cli"]
    for module in modules:
        if module not in house.modules:
            continue
        for node in ast.walk(house.trees[module]):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == command:
                        found = walker.resolve_expr(value, None, module)
                        if found and found[0] == "func":
                            return found[1]
        idx = walker.index[module]
        for name in (f"_{command}", command):
            if name in idx.functions:
                return idx.functions[name]
    raise LookupError(f"no handler of the {command!r} command found in {modules}")


def find_function(walker: Walker, spec: str) -> Func:
    module, _, qual = spec.partition(":")
    idx = walker.index[module]
    if "." in qual:
        cls, _, name = qual.partition(".")
        return idx.methods[(cls, name)]
    return idx.functions[qual]


# ------------------------------------------------------------------------------------------------ report


def render(house: House, closure_of: list[str], walk_command: str = "train", walk_start: str | None = None,
           runtime: bool = True) -> str:
    out: list[str] = []
    w = out.append
    total_lines = sum(house.lines.values())
    floors: dict[str, list[str]] = defaultdict(list)
    for m in house.modules:
        floors[house.floor(m)].append(m)
    all_edges = house.edges()
    load_edges = house.edges(load_time_only=True)
    w(f"# The house of `{house.top}`\n")
    w(f"Root: the repository (package-dir of pyproject.toml). {len(house.modules)} modules, {total_lines} lines, "
      f"{len(floors)} floors (folders); {len(all_edges)} import edges between modules "
      f"({len(load_edges)} of them at load time).\n")

    w("## Summary\n")
    cycles_all = house.module_cycles()
    cycles_load = house.module_cycles(load_time_only=True)
    pairs, floor_sccs = house.floor_cycles()
    upward = house.upward()
    w("| number | value |\n|---|---:|")
    w(f"| modules | {len(house.modules)} |")
    w(f"| lines | {total_lines} |")
    w(f"| floors | {len(floors)} |")
    w(f"| import edges (all / load-time) | {len(all_edges)} / {len(load_edges)} |")
    w(f"| module cycles, all imports (SCCs; modules in them) | {len(cycles_all)} ({sum(len(c[0]) for c in cycles_all)}) |")
    w(f"| module cycles, load-time imports (SCCs; modules in them) | {len(cycles_load)} ({sum(len(c[0]) for c in cycles_load)}) |")
    w(f"| folder cycles (pairs of folders importing each other) | {len(pairs)} |")
    w(f"| folder SCCs of more than two folders | {len(floor_sccs)} |")
    w(f"| arrows running back up (imports to a higher layer rank) | {sum(len(v) for v in upward.values())} |")
    largest = max(house.lines, key=house.lines.get)
    w(f"| largest module | `{house.rel(largest)}` ({house.lines[largest]} lines) |")
    summaries: list[str] = []
    for module in closure_of:
        cl = house.closure(module)
        summaries.append(f"| closure of `import {module}` (files / lines) | {len(cl)} / {sum(house.lines[m] for m in cl)} |")
        cl = house.closure(module, load_time_only=False)
        summaries.append(f"| closure of `{module}` with function-local imports (files / lines) | {len(cl)} / "
                         f"{sum(house.lines[m] for m in cl)} |")
    out += summaries
    walker = Walker(house)
    try:
        start = find_function(walker, walk_start) if walk_start else find_train_handler(house, walker, walk_command)
        walk = walker.walk(start)
    except (LookupError, KeyError) as error:
        start, walk = None, None
        w(f"| walk | not found: {error} |")
    if walk is not None:
        nums = walk.numbers()
        climbs = [(a, b) for (a, b) in sorted(walk.edges) if _climbs(house, *walk.edge_funcs[(a, b)])]
        cfg_walked = [f for f in walk.functions if walker.takes_config(f)[0]]
        w(f"| walk from `{start.key}`: functions / files entered / file switches / returns / climbs back up | "
          f"{nums['functions walked']} / {nums['files entered']} / {nums['file switches']} / {nums['returns']} / "
          f"{len(climbs)} |")
        w(f"| walked functions taking the whole Config (files) | {len(cfg_walked)} "
          f"({len({f.module for f in cfg_walked})}) |")
    cfg_all = [f for f in walker.functions() if walker.takes_config(f)[0]]
    w(f"| package functions taking the whole Config (files) | {len(cfg_all)} ({len({f.module for f in cfg_all})}) |")
    w("")

    w("## Floors and rooms\n")
    for floor in sorted(floors):
        members = floors[floor]
        w(f"### `{house.floor_dir(floor)}/` ({floor}): {len(members)} rooms, {sum(house.lines[m] for m in members)} lines\n")
        w("| room | lines | layer |\n|---|---:|---|")
        for m in sorted(members, key=lambda m: house.rel(m)):
            r = house.rank(m)
            w(f"| `{Path(house.rel(m)).name}` | {house.lines[m]} | {f'{r[0]} {r[1]}' if r else '?'} |")
        w("")

    w("## Import edges\n")
    w("`importer -> imported` (lines; `*` marks a function-local import, `T` one under `if TYPE_CHECKING:`).\n")
    by_src: dict[str, list[str]] = defaultdict(list)
    for (a, b), found in all_edges.items():
        marks = ", ".join(f"{i.line}{'*' if i.local else ''}{'T' if i.type_checking else ''}" for i in found)
        by_src[a].append(f"`{b}` ({marks})")
    for a in house.modules:
        if by_src[a]:
            w(f"- `{a}` -> " + "; ".join(by_src[a]))
    w("")

    w("## Module cycles\n")
    for title, cycles in (("All imports (top-level and function-local)", cycles_all),
                          ("Load-time imports only", cycles_load)):
        w(f"### {title}: {len(cycles)}\n")
        edges = all_edges if cycles is cycles_all else load_edges
        for i, (members, closing) in enumerate(cycles, 1):
            w(f"{i}. {len(members)} modules: " + ", ".join(f"`{m}`" for m in members))
            for a, b in closing:
                lines = ", ".join(f"{x.line}{'*' if x.local else ''}" for x in edges[(a, b)])
                w(f"   - `{a}` -> `{b}` ({house.rel(a)}:{lines})")
        if not cycles:
            w("none")
        w("")

    w("## Folder cycles\n")
    fe = house.floor_edges()
    w(f"Pairs of folders importing each other: {len(pairs)}.\n")
    for a, b in pairs:
        w(f"- `{house.floor_dir(a)}/` <-> `{house.floor_dir(b)}/`")
        for x, y in ((a, b), (b, a)):
            w(f"  - {x} -> {y}: " + ", ".join(f"`{s}` -> `{t}`" for s, t in fe[(x, y)]))
    if floor_sccs:
        w("\nStrongly connected groups of more than two folders:\n")
        for comp in floor_sccs:
            w("- " + ", ".join(f"`{house.floor_dir(f)}/`" for f in comp))
    w("")

    w("## Arrows running back up\n")
    if not house.layers:
        w("No layer table (tests/test_layers.py LAYERS) found.\n")
    else:
        names = {rank: name for rank, name, _ in house.layers}
        w("Imports from a module to a module of a higher layer rank (tests/test_layers.py LAYERS).\n")
        w("| rank | layer | imports going up |\n|---:|---|---:|")
        for rank in sorted(names):
            w(f"| {rank} | {names[rank]} | {len(upward.get(rank, []))} |")
        unranked = [m for m in house.modules if house.rank(m) is None]
        if unranked:
            w(f"\nModules in no layer: " + ", ".join(f"`{m}`" for m in unranked))
        for rank, found in upward.items():
            for a, b, imp in found:
                rb = house.rank(b)
                w(f"- {house.rel(a)}:{imp.line}: `{a}` ({names[rank]}) imports `{b}` ({rb[1]})")
        w("")

    w("## Import closures\n")
    for module in closure_of:
        cl = house.closure(module)
        w(f"### `import {module}`\n")
        w(f"Statically: {len(cl)} files, {sum(house.lines[m] for m in cl)} lines.\n")
        w(", ".join(f"`{m}` ({house.lines[m]})" for m in cl) + "\n")
        wide = house.closure(module, load_time_only=False)
        w(f"With function-local imports too (what calling every function of it could import): {len(wide)} files, "
          f"{sum(house.lines[m] for m in wide)} lines.\n")
        if runtime:
            found = house.runtime_closure(module)
            if "error" in found:
                w(f"Runtime check failed: {found['error']}\n")
            else:
                mods = [m for m in found["modules"] if m in house.modules]
                others = [m for m in found["modules"] if m not in house.modules]
                where = Path(found["file"]).resolve()
                w(f"At runtime (`import {module}` in a fresh interpreter): {len(mods)} modules of the package in "
                  f"sys.modules, {sum(house.lines[m] for m in mods)} lines"
                  + (f" (and {len(others)} names that are no file here: {', '.join(others)})" if others else "") + ".")
                if not where.is_relative_to(house.root):
                    w(f"WARNING: the package was imported from {where}, not from {house.root}.")
                only_static = sorted(set(cl) - set(mods))
                only_runtime = sorted(set(mods) - set(cl))
                w(f"Only static: {', '.join(only_static) or 'none'}. Only at runtime: {', '.join(only_runtime) or 'none'}.\n")

    w("## The walk of a configuration\n")
    if walk is None:
        w("No start function found.\n")
    else:
        nums = walk.numbers()
        w(f"From `{start.key}` ({house.rel(start.module)}:{start.node.lineno}).\n")
        w("| number | value |\n|---|---:|")
        for k, v in nums.items():
            w(f"| {k} | {v} |")
        w(f"| climbs back up | {len(climbs)} |\n")
        per_file: dict[str, list[Func]] = defaultdict(list)
        for f in walk.functions:
            per_file[f.module].append(f)
        order = list(dict.fromkeys(f.module for f in walk.functions))
        w("Files in the order first entered (functions walked there; of them taking the whole Config):\n")
        w("| file | layer | functions | taking Config |\n|---|---|---:|---|")
        for m in order:
            r = house.rank(m)
            cfg = [f.qualname for f in per_file[m] if walker.takes_config(f)[0]]
            w(f"| `{house.rel(m)}` | {f'{r[0]} {r[1]}' if r else '?'} | {len(per_file[m])} | "
              f"{len(cfg)}{': ' + ', '.join(f'`{q}`' for q in cfg) if cfg else ''} |")
        w("")
        w("The reader's path (files, consecutive repeats collapsed):\n")
        w(" -> ".join(_short(house, m) for m in walk.sequence()) + "\n")
        w("Climbs back up (caller -> callee, ranks):\n")
        for a, b in climbs:
            fa, fb = walk.edge_funcs[(a, b)]
            w(f"- `{a}` ({house.rank(fa.module)[0]}) -> `{b}` ({house.rank(fb.module)[0]})")
        if not climbs:
            w("none")
        w("")
    w("## Functions taking the whole Config, per file (whole package)\n")
    per_file_cfg: dict[str, list[str]] = defaultdict(list)
    maybe_cfg: dict[str, list[str]] = defaultdict(list)
    for f in walker.functions():
        sure, maybe = walker.takes_config(f)
        if sure:
            per_file_cfg[f.module].append(f.qualname)
        if maybe:
            maybe_cfg[f.module].append(f.qualname)
    w("| file | functions | names |\n|---|---:|---|")
    for m in house.modules:
        if per_file_cfg[m]:
            w(f"| `{house.rel(m)}` | {len(per_file_cfg[m])} | {', '.join(f'`{q}`' for q in per_file_cfg[m])} |")
    w("")
    if any(maybe_cfg.values()):
        w("Maybe (a parameter named config/cfg without annotation):\n")
        for m in house.modules:
            if maybe_cfg[m]:
                w(f"- `{house.rel(m)}`: {', '.join(f'`{q}`' for q in maybe_cfg[m])}")
        w("")
    return "\n".join(out)


def _short(house: House, module: str) -> str:
    """A file's name without .py; a package's ``__init__`` keeps its folder (``envs/__init__``)."""
    rel = house.rel(module).removesuffix(".py")
    return rel if rel.endswith("__init__") else rel.rsplit("/", 1)[-1]


def _climbs(house: House, caller: Func, callee: Func) -> bool:
    ra, rb = house.rank(caller.module), house.rank(callee.module)
    return ra is not None and rb is not None and rb[0] > ra[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=HERE_ROOT, help="repository root (default: this one)")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here (default: stdout)")
    parser.add_argument("--closure", action="append", default=None, metavar="MODULE",
                        help="module whose import closure is counted: a dotted name, or its last parts when they "
                             "name one module (repeatable; default: report, i.e. <package>.report wherever it lives)")
    parser.add_argument("--walk-command", default="train", help="CLI command whose handler starts the walk")
    parser.add_argument("--walk-start", default=None, metavar="MODULE:FUNCTION",
                        help="start the walk here instead (FUNCTION may be Class.method)")
    parser.add_argument("--no-runtime", action="store_true", help="skip the runtime check of the closures")
    args = parser.parse_args(argv)
    house = House.read(args.root)
    closure = [house.find_module(name) for name in (args.closure or ["report"])]
    text = render(house, closure, args.walk_command, args.walk_start, runtime=not args.no_runtime)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
