"""Kernel families (tree_gdn, ...). Their sources sit in the repository's top-level kernels/ folder, which
setup.py installs as this package's subpackages (see kernels/README.md)."""
