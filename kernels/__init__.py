"""Kernel families (tree_gdn, fold, ...), installed as speclib.kernels."""
