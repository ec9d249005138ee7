"""Kernel families (tree_gdn, ...), installed as `speclib.kernels` (see kernels/README.md).

Run from the repository root (`python -m ...`, `pytest`), this folder also sits on sys.path as a
top-level package named `kernels`, the name of the Hugging Face kernels hub package that transformers
requires and imports. Imported under that name, it hands the name over to the installed package (or,
where none is installed, stays an empty package without a version, which transformers ignores).
"""

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _here]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _path)
    if _spec is not None and _spec.loader is not None:
        _real = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _real  # the import statement returns sys.modules["kernels"]
        _spec.loader.exec_module(_real)
