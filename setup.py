"""The package list, found rather than listed: every package under speclib/, and each kernel family in the
top-level kernels/ folder installed as speclib.kernels.<family>. The rest of the metadata is in pyproject.toml.

kernels/ itself has no __init__.py: run from the repository root, a top-level `kernels` would otherwise
shadow the Hugging Face kernels hub package of that name (transformers imports it)."""

from setuptools import find_packages, setup

FAMILIES = find_packages("kernels")  # tree_gdn, ... (and their subpackages)

setup(
    packages=find_packages(include=["speclib", "speclib.*"]) + [f"speclib.kernels.{p}" for p in FAMILIES],
    package_dir={"speclib": "speclib"} | {f"speclib.kernels.{p}": "kernels/" + p.replace(".", "/") for p in FAMILIES},
)
