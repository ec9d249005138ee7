"""The package list, found rather than listed: every package under speclib/, and kernels/ (the top-level
folder of kernel sources) installed as speclib.kernels. The rest of the metadata is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["speclib", "speclib.*"])
    + ["speclib.kernels"]
    + [f"speclib.kernels.{p}" for p in find_packages("kernels")],
    package_dir={"speclib": "speclib", "speclib.kernels": "kernels"},
)
