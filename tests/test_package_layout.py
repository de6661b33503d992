"""The package layout keeps its rules (issues 17 and 36): no import circle in kvsim (imports inside
functions count), at most eight modules at the top of kvsim, none over 300 lines, no folder of more than 15
modules, no three siblings sharing a name prefix (the prefix is a folder), no module repeating its
package's name, every package's __init__ saying what it may import, tests/ mirroring the package folder by
folder, the engine's step plan free of the allocators, only the scheduler's package calling into
`kvsim.alloc`, and no torch, triton or (in what the GPU harness imports) SimPy where they must not be.

`python -m pytest tests/test_package_layout.py -q` is the command that shows there is no circle; `import_graph`
and `find_cycle` are checked on small graphs first so that a broken checker cannot pass silently; so are
`crowded_prefixes` and `unmatched_test_folders`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_names(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `package` (a package is its __init__)."""
    base = package.parent
    return {".".join(p.relative_to(base).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted(package.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in its body (functions included); `from a
    import b` counts as importing `a.b` when that is a module, else `a`."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in known} - {name}


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. An import of a module's own parent package is left
    out (Python runs the parent's __init__ first either way; it is not a tie between layers)."""
    mods = module_names(package)
    known = set(mods)
    return {m: {d for d in imports_of(m, p, known) if not m.startswith(d + ".")} for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def visit(u: str, stack: list[str]) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if not state.get(v) and (found := visit(v, stack)):
                return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if not state.get(u) and (found := visit(u, [])):
            return found
    return None


def test_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from p.sub import b\n")     # parent -> child: not a tie
    (pkg / "a.py").write_text("from p.sub.b import x\n")
    (pkg / "sub" / "b.py").write_text("from p import c\nx = 1\n")
    (pkg / "c.py").write_text("def f():\n    from .a import g\n")
    graph = import_graph(pkg)
    assert graph["p.a"] == {"p.sub.b"} and graph["p.sub.b"] == {"p.c"} and graph["p.c"] == {"p.a"}
    assert find_cycle(graph) == ["p.a", "p.sub.b", "p.c", "p.a"]
    (pkg / "c.py").write_text("def f():\n    pass\n")
    assert find_cycle(import_graph(pkg)) is None


def test_no_import_circle_in_kvsim():
    assert find_cycle(import_graph(ROOT / "kvsim")) is None


def test_at_most_eight_top_level_modules_and_none_over_300_lines():
    top = sorted(p.name for p in (ROOT / "kvsim").glob("*.py"))
    assert len(top) <= 8, top
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "kvsim").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert not long


#: the most modules (besides __init__) one folder of kvsim may hold
MAX_MODULES_PER_FOLDER = 15
#: test folders that mirror no package: checks that drive vLLM's own code (with their drivers), and the
#: end-to-end checks (README commands, notebooks, shipped reports, the browser)
TEST_FOLDERS_OF_THEIR_OWN = ("vllm", "e2e")


def folders(package: Path) -> list[Path]:
    """Every package folder under (and including) `package`."""
    return [package, *sorted(p.parent for p in package.rglob("*/__init__.py"))]


def siblings(folder: Path) -> list[str]:
    """The names of a folder's modules (no __init__) and subpackages."""
    return sorted([p.stem for p in folder.glob("*.py") if p.name != "__init__.py"]
                  + [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()])


def crowded_prefixes(names: list[str]) -> dict[str, list[str]]:
    """{prefix: names} for every first word (up to the first underscore) that three or more names share."""
    by_prefix: dict[str, list[str]] = {}
    for n in names:
        by_prefix.setdefault(n.split("_")[0], []).append(n)
    return {k: v for k, v in by_prefix.items() if len(v) >= 3}


def unmatched_test_folders(tests: Path, packages: list[Path]) -> list[str]:
    """Folders under `tests` (data and __pycache__ aside) whose path names no package folder of `packages`
    (`tests/alloc/hybrid` <-> `kvsim/alloc/hybrid`; `tests/gpu_harness` <-> `gpu_harness`)."""
    known = set()
    for top in packages:
        for f in folders(top):
            rel = f.relative_to(top)
            if top.name != "kvsim":
                known.add(top.name if rel == Path(".") else f"{top.name}/{rel}")
            elif rel != Path("."):
                known.add(str(rel))
    out = []
    for d in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = d.relative_to(tests)
        if rel.parts[0] in ("data", *TEST_FOLDERS_OF_THEIR_OWN) or "__pycache__" in rel.parts:
            continue
        if str(rel) not in known:
            out.append(str(rel))
    return out


def test_layout_checkers_on_made_up_names(tmp_path):
    assert crowded_prefixes(["rate", "rate_bounds", "runs"]) == {}
    assert crowded_prefixes(["rate", "rate_bounds", "rate_runs", "sweep"]) == {"rate": ["rate", "rate_bounds",
                                                                                     "rate_runs"]}
    pkg = tmp_path / "kvsim"
    (pkg / "alloc" / "paged").mkdir(parents=True)
    for d in (pkg, pkg / "alloc", pkg / "alloc" / "paged"):
        (d / "__init__.py").write_text("")
    (tmp_path / "tests" / "alloc" / "paged").mkdir(parents=True)
    (tmp_path / "tests" / "alloc" / "hybrid").mkdir()
    (tmp_path / "tests" / "e2e").mkdir()
    assert siblings(pkg / "alloc") == ["paged"]
    assert unmatched_test_folders(tmp_path / "tests", [pkg]) == ["alloc/hybrid"]


def test_no_crowded_folder_and_no_shared_prefix():
    for folder in folders(ROOT / "kvsim"):
        names = siblings(folder)
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        where = folder.relative_to(ROOT)
        assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{where} holds {len(modules)} modules"
        assert not crowded_prefixes(names), f"{where}: a shared prefix is a folder: {crowded_prefixes(names)}"
        assert not [n for n in names if n != folder.name and n.startswith(folder.name + "_")], \
            f"{where}: a module repeats its package's name"


def test_tests_mirror_the_package():
    assert unmatched_test_folders(ROOT / "tests", [ROOT / "kvsim", ROOT / "gpu_harness"]) == []


def test_every_subpackage_says_what_it_holds():
    for init in (ROOT / "kvsim").glob("*/**/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "import" in doc.lower(), f"{init.relative_to(ROOT)} has no docstring saying what it may import"


def test_only_the_scheduler_reaches_the_allocators():
    """Inside kvsim.engine only the scheduler's modules (in `kvsim.engine.batching`) call an allocator
    (`build` makes one, `config` names the kinds); the step plan, the SimPy loop, the metrics and the
    other batching policies know none."""
    graph = import_graph(ROOT / "kvsim")
    users = {m for m, deps in graph.items() if m.startswith("kvsim.engine.")
             and any(d == "kvsim.alloc" or d.startswith("kvsim.alloc.") for d in deps)}
    assert users <= {"kvsim.engine.batching.scheduler", "kvsim.engine.batching.request_state",
                     "kvsim.engine.batching.lazy_decode", "kvsim.engine.build", "kvsim.engine.config",
                     "kvsim.engine.batching.vllm2023.scheduler"}, users
    assert "kvsim.engine.step" not in users


def test_fleet_sits_between_the_engine_and_planning():
    """kvsim.fleet runs several engines: it may import the engine (and what the engine may), never the
    allocators directly, planning or the CLI; nothing below it (trace, specs, cost, alloc, engine)
    imports it."""
    graph = import_graph(ROOT / "kvsim")
    below = ("kvsim.trace", "kvsim.specs", "kvsim.cost", "kvsim.alloc", "kvsim.engine")
    for m, deps in graph.items():
        if m.startswith("kvsim.fleet"):
            assert not {d for d in deps if d.startswith(("kvsim.alloc", "kvsim.planning", "kvsim.cli"))}, m
        elif m.startswith(below):
            assert not {d for d in deps if d.startswith("kvsim.fleet")}, m


def test_no_torch_or_triton_in_kvsim_and_no_simpy_under_the_harness():
    graph = import_graph(ROOT / "kvsim")
    for name, path in module_names(ROOT / "kvsim").items():
        tops = {n.split(".")[0] for n in _all_imports(path)}
        assert not tops & {"torch", "triton"}, name
    # what gpu_harness imports of kvsim, and everything that pulls in, must not need SimPy
    harness = set()
    for path in (ROOT / "gpu_harness").rglob("*.py"):
        harness |= {n for n in _all_imports(path) if n in graph}
    seen, todo = set(), list(harness)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            # a module's parent package runs first; kvsim's own __init__ loads its names lazily
            todo += graph[m] | ({m.rpartition(".")[0]} & set(graph) - {"kvsim"})
    simpy_users = {m for m in seen if "simpy" in {n.split(".")[0] for n in _all_imports(
        module_names(ROOT / "kvsim")[m])}}
    assert not simpy_users, simpy_users


def _all_imports(path: Path) -> set[str]:
    """Absolute imports anywhere in `path`, except inside a `try` that handles ImportError (an optional
    import with a fallback, as the harness's `--expect`-less replay check)."""
    out: set[str] = set()
    for node in _walk_unguarded(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _walk_unguarded(node: ast.AST):
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Try) and any(_catches_import_error(h) for h in child.handlers):
            for rest in (*child.handlers, *child.orelse, *child.finalbody):
                yield from _walk_unguarded(rest)
            continue
        yield from _walk_unguarded(child)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def test_the_fleet_reaches_replicas_only_through_their_schedulers():
    """kvsim.fleet (replicas, router, disaggregation) sits on the engine: it builds each replica with
    `kvsim.engine.build` and asks its scheduler; it never imports kvsim.alloc, and nothing below
    planning/cli (and `kvsim` itself) imports it."""
    graph = import_graph(ROOT / "kvsim")
    fleet = {m for m in graph if m == "kvsim.fleet" or m.startswith("kvsim.fleet.")}
    assert not {d for m in fleet for d in graph[m] if d == "kvsim.alloc" or d.startswith("kvsim.alloc.")}
    users = {m for m, deps in graph.items() if m not in fleet and deps & fleet}
    assert all(m == "kvsim" or m.startswith(("kvsim.planning", "kvsim.cli")) for m in users), users
