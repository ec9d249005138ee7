"""The package's layers (docs/architecture.md): each module imports only from its own layer or the layers
below it, wherever the import statement sits (top of the module or inside a function), and modules
import each other without cycles."""

import ast
from pathlib import Path

from speclib.core.device import REPO

LAYERS = {"core": 0, "kernels": 1, "lms": 2, "drafters": 3, "acceptors": 3, "research": 4, "serving": 4, "workbook": 5}
TOP = 6  # speclib/__init__.py and __main__.py: the public API, the CLI


def modules() -> dict[str, Path]:
    """speclib module name -> file, for speclib/ and kernels/ (installed as speclib.kernels)."""
    out = {}
    for root, prefix in ((REPO / "speclib", "speclib"), (REPO / "kernels", "speclib.kernels")):
        for f in root.rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((prefix, *parts))] = f
    return out


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 and parts[1] in LAYERS else TOP


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """speclib modules `name` imports (a `from pkg import sub` of a submodule counts as importing it)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("speclib")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("speclib"):
                continue
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            out |= subs or {mod}
    return out


def test_no_module_imports_a_higher_layer():
    mods = modules()
    bad = [
        f"{m} (layer {layer(m)}) imports {i} (layer {layer(i)})"
        for m, f in mods.items()
        for i in imports(m, f, set(mods))
        if layer(i) > layer(m)
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    mods = modules()
    graph = {
        m: {i for i in imports(m, f, set(mods)) if i in mods and i != m and not m.startswith(i + ".")}
        for m, f in mods.items()
    }
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_every_module_belongs_to_a_layer():
    """A module directly under speclib/ beside the layer folders is the API or the CLI, nothing else."""
    loose = sorted(p.name for p in (REPO / "speclib").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose


def test_architecture_page_names_every_module():
    """docs/architecture.md is where a newcomer looks for a module: it names every file of every layer."""
    page = (REPO / "docs" / "architecture.md").read_text()
    files = [p for root in ("speclib", "kernels") for p in (REPO / root).rglob("*.py") if p.name != "__init__.py"]
    missing = sorted(str(p.relative_to(REPO)) for p in files if p.name != "__main__.py" and f"`{p.name}`" not in page)
    assert not missing, f"docs/architecture.md does not name {missing}"
