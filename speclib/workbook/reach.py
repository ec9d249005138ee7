"""The code a notebook step can reach, fingerprinted definition by definition, so that editing code the step
never uses, or moving and renaming a module, does not make its results stale.

A **definition** is a top-level function, class or named assignment of a speclib module (`speclib.research.bench:
paired_runs`), or of a notebook source (`notebook:hvd_pilot`, `notebook:ARGS`). Its fingerprint is the sha1 of
its normalized source: docstrings dropped, comments and layout gone (`ast.unparse`), and every reference that
goes through a module (`bench.paired_runs`, `speclib.core.device.clock`) written as the bare name, so a move
of a function or a module changes no fingerprint but the import lines, which are not part of any definition.

A step reaches, from its `study.step("name", ...)` statement in the notebook source, every definition that
statement names, transitively: the names a definition's body uses, resolved through its module's own
definitions and its imports (re-exports followed), plus every module named by a string constant
(`"speclib.serving.server"`; `"speclib"` stands for `python -m speclib`, its `__main__`). What this cannot
see: code reached only through an object's attribute that no reachable definition names (a method of a class
that is never named), or through `getattr` with a computed name.

    fingerprints = reach.step_definitions(REPO / "notebooks/src/08_serving.py", "load")   # {"module:name": sha1}
    reach.changed(fingerprints)  # [] when every definition still exists, here or moved elsewhere, unchanged
"""

from __future__ import annotations

import ast
import copy
import hashlib
from pathlib import Path

from speclib.core.device import REPO

ROOTS = {"speclib": REPO / "speclib", "speclib.kernels": REPO / "kernels"}  # package -> its folder
NOTEBOOK = "notebook"  # the module name of a notebook's own definitions
DEFINES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
BLOCKS = (ast.If, ast.Try, ast.With, ast.For)  # top-level compound statements whose bodies also define names

__all__ = ["step_definitions", "changed", "module_file"]


def module_file(module: str, roots: dict[str, Path] | None = None) -> Path | None:
    """The file of a dotted module name under `roots` (its `__init__.py` for a package), or None."""
    roots = ROOTS if roots is None else roots
    if not all(part.isidentifier() for part in module.split(".")):
        return None
    for package in sorted(roots, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            base = (
                roots[package].joinpath(*module[len(package) :].lstrip(".").split("."))
                if module != package
                else roots[package]
            )
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file():
                    return f
    return None


def _statements(body: list[ast.stmt]):
    """Top-level statements, with the bodies of top-level if / try / with / for blocks flattened in."""
    for node in body:
        if isinstance(node, BLOCKS):
            for part in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(node, part, []))
            for handler in getattr(node, "handlers", []):
                yield from _statements(handler.body)
        else:
            yield node


def _targets(node: ast.stmt) -> list[str]:
    if isinstance(node, DEFINES):
        return [node.name]
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, (ast.AnnAssign, ast.AugAssign))
        else []
    )
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _local_names(stmt: ast.stmt) -> set[str]:
    """Names bound inside the functions, lambdas and comprehensions of a statement (arguments, assignments,
    loop targets): there they are not the module's definitions of the same name."""
    out = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            out |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                    out.add(inner.id)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            out |= {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
    return out


class _Module:
    """One source file: its definitions (name -> statements), its imports (alias -> module, or (module, name))."""

    def __init__(self, name: str, tree: ast.Module, roots: dict[str, Path]):
        self.name, self.roots = name, roots
        self.defs: dict[str, list[ast.stmt]] = {}
        self.modules: dict[str, str] = {}  # alias -> a module
        self.names: dict[str, tuple[str, str]] = {}  # alias -> (module, name) imported from it
        self.body = list(_statements(tree.body))
        for node in self.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if module_file(a.name, roots):
                        self.modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node)
                for a in node.names:
                    if module_file(f"{base}.{a.name}", roots):
                        self.modules[a.asname or a.name] = f"{base}.{a.name}"
                    elif module_file(base, roots):
                        self.names[a.asname or a.name] = (base, a.name)
            else:
                for t in _targets(node):
                    self.defs.setdefault(t, []).append(node)

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.name.split(".")
        is_package = (module_file(self.name, self.roots) or Path()).name == "__init__.py"
        base = parts[: len(parts) - node.level + (1 if is_package else 0)]
        return ".".join(base + ([node.module] if node.module else []))

    def dotted(self, node: ast.expr) -> tuple[str, str] | None:
        """A `mod.sub.name` chain rooted at an imported module: (module, first name after it)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.modules:
            return None
        chain = [self.modules[node.id], *reversed(parts)]
        for cut in range(len(chain) - 1, 0, -1):
            if module_file(".".join(chain[:cut]), self.roots):
                return ".".join(chain[:cut]), chain[cut]
        return None


class _Normalize(ast.NodeTransformer):
    """Docstrings dropped, module-qualified references written as bare names."""

    def __init__(self, module: _Module):
        self.module = module

    def visit_Attribute(self, node):
        hit = self.module.dotted(node)
        if hit is None:
            return self.generic_visit(node)
        chain, inner = [], node  # the attributes after the name stay: mod.Class.method -> Class.method
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        chain.reverse()
        out: ast.expr = ast.Name(hit[1], ast.Load())
        for attr in chain[chain.index(hit[1]) + 1 :]:
            out = ast.Attribute(out, attr, ast.Load())
        return out

    def generic_visit(self, node):
        body = getattr(node, "body", None)
        if isinstance(node, (*DEFINES, ast.Module)) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        return super().generic_visit(node)


class Index:
    """Parsed modules under `roots` (and notebook sources, by path), with the fingerprint of every definition."""

    def __init__(self, roots: dict[str, Path] | None = None):
        self.roots = ROOTS if roots is None else roots
        self._modules: dict[str, _Module | None] = {}
        self._prints: dict[tuple[int, str], str] = {}

    def module(self, name: str, path: Path | None = None) -> _Module | None:
        """Module `name` parsed (a notebook source: from `path`, cached by it, as every notebook is `NOTEBOOK`)."""
        key = f"{name}@{path}" if path else name
        if key not in self._modules:
            f = path or module_file(name, self.roots)
            self._modules[key] = _Module(name, ast.parse(f.read_text()), self.roots) if f and f.is_file() else None
        return self._modules[key]

    def fingerprint(self, module: _Module, name: str) -> str:
        key = (id(module.defs[name]), name)
        if key not in self._prints:
            text = "\n".join(ast.unparse(_Normalize(module).visit(copy.deepcopy(n))) for n in module.defs[name])
            self._prints[key] = hashlib.sha1(text.encode()).hexdigest()[:12]
        return self._prints[key]

    def resolve(self, module: _Module, name: str, seen: frozenset = frozenset()) -> tuple[_Module, str] | None:
        """Where `name`, as `module` sees it, is defined (re-exports followed), or None (not speclib's)."""
        if name in module.defs:
            return module, name
        if name in module.names and (module.name, name) not in seen:
            source, original = module.names[name]
            target = self.module(source)
            return self.resolve(target, original, seen | {(module.name, name)}) if target else None
        return None

    def _run_modules(self, stmt: ast.stmt):
        """Modules a statement runs by name: a dotted module string ("speclib.serving.server"), and the module
        after "-m" in a command list (`python -m speclib` runs speclib/__main__.py)."""
        for node in ast.walk(stmt):
            if isinstance(node, (ast.List, ast.Tuple)):
                words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                for flag, word in zip(words, words[1:]):
                    if flag == "-m" and isinstance(word, str) and module_file(f"{word}.__main__", self.roots):
                        yield f"{word}.__main__"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
                if module_file(node.value, self.roots):
                    yield node.value

    def references(self, module: _Module, name: str):
        """The definitions `module`'s definition `name` uses (names local to its functions aside), and every
        definition of the modules it runs by name."""
        for stmt in module.defs[name]:
            local = _local_names(stmt)
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
                    hit = self.resolve(module, node.id)
                elif isinstance(node, ast.Attribute) and (d := module.dotted(node)):
                    target = self.module(d[0])
                    hit = self.resolve(target, d[1]) if target else None
                else:
                    continue
                if hit and hit != (module, name):
                    yield hit
            for run in self._run_modules(stmt):
                named = self.module(run)
                yield from ((named, n) for n in (named.defs if named else {}))

    def closure(self, starts) -> dict[str, str]:
        """{"module:name": fingerprint} of every definition reachable from `starts` [(module, name)]."""
        out, todo = {}, list(starts)
        while todo:
            module, name = todo.pop()
            key = f"{module.name}:{name}"
            if key in out:
                continue
            out[key] = self.fingerprint(module, name)
            todo.extend(self.references(module, name))
        return dict(sorted(out.items()))

    def everywhere(self) -> set[str]:
        """The fingerprints of every definition under the roots now."""
        found = set()
        for package, folder in self.roots.items():
            for f in folder.rglob("*.py"):
                parts = f.relative_to(folder).with_suffix("").parts
                name = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
                if (m := self.module(name)) is not None:
                    found |= {self.fingerprint(m, n) for n in m.defs}
        return found


def _step_calls(module: _Module, step: str) -> list[ast.stmt]:
    """The notebook's statements that run `study.step(step, ...)` (a call whose first argument is that name)."""
    out = []
    for stmt in module.body:
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "step"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == step
            ):
                out.append(stmt)
                break
    return out


def step_definitions(notebook_source: Path, step: str, index: Index | None = None) -> dict[str, str] | None:
    """{"module:name": fingerprint} of what step `step` of a notebook source reaches: the statement that runs it
    (`notebook:step:NAME`) and every definition it uses, notebook and speclib ones; None when the source has no
    such statement (a step run outside the notebooks, or from an edited copy)."""
    index = index or Index()
    nb = index.module(NOTEBOOK, Path(notebook_source))
    calls = _step_calls(nb, step) if nb else []
    if not calls:
        return None
    key = f"step:{step}"
    nb.defs[key] = calls
    return index.closure([(nb, key)])


def changed(fingerprints: dict[str, str], notebook_source: Path | None = None, index: Index | None = None) -> list[str]:
    """Reasons a step's recorded definitions no longer hold: a definition that changed, or one that is gone and
    whose fingerprint is nowhere in the code now (a moved or renamed definition is not a change)."""
    index = index or Index()
    nb = index.module(NOTEBOOK, Path(notebook_source)) if notebook_source else None
    if nb is not None:
        for key in [k for k in fingerprints if k.startswith(f"{NOTEBOOK}:step:")]:
            step = key.split(":", 2)[2]
            nb.defs[f"step:{step}"] = _step_calls(nb, step)
    in_notebook = {index.fingerprint(nb, n) for n in nb.defs if nb.defs[n]} if nb else set()
    anywhere: set[str] | None = None
    reasons = []
    for key, fp in fingerprints.items():
        name, _, attr = key.partition(":")
        module = nb if name == NOTEBOOK else index.module(name)
        there = module is not None and bool(module.defs.get(attr))
        if there and index.fingerprint(module, attr) == fp:
            continue
        if name == NOTEBOOK:
            if fp not in in_notebook:  # a renamed notebook definition is not a change
                reasons.append(f"the notebook's {attr} {'changed' if there else 'removed'}")
            continue
        anywhere = index.everywhere() if anywhere is None else anywhere
        if fp not in anywhere:  # a moved or renamed definition is not a change
            reasons.append(f"{name}.{attr} {'changed' if there else 'removed'}")
    return reasons
