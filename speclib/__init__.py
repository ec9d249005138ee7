"""speclib: speculative decoding from scratch, as a research workbook.

    target = speclib.load("code-target"); draft = speclib.load("code-draft")
    out = speclib.generate(target, target.encode("def f(x):\\n"), 64,
                           drafter=speclib.ModelDrafter(draft, k=4), sampling=speclib.Sampling(0.0))

The package is layered (docs/architecture.md); each layer imports only from the layers before it:
core (the loop, protocols, sampling, acceptance, trees) -> kernels, lms (models behind the LM protocol)
-> drafters, acceptors -> research (benchmarks, statistics, training, data) -> workbook (notebooks,
results, report, book, sweeps). The names below are the public API, re-exported from where they live.
"""

from speclib.acceptors.cospec import Arbiter
from speclib.core.acceptance import Lossless
from speclib.core.generate import Generation, Stats, generate, generate_batch
from speclib.core.protocols import LM, Acceptor, Drafter, FeatureLM
from speclib.core.sampling import Sampling
from speclib.core.tree import Tree
from speclib.drafters import (
    ExitAdapter,
    FeatureDrafter,
    HybridDrafter,
    LayerSkipDrafter,
    Lookahead,
    ModelDrafter,
    PromptLookupDrafter,
    RestDrafter,
    SelfDrafter,
    SuffixDrafter,
    TokenRecycling,
    TreeDrafter,
)
from speclib.lms.head import heads, load_head
from speclib.lms.lm import HFLM, checkpoints
from speclib.lms.loading import load
from speclib.lms.stateful import StatefulLM

__all__ = [
    "Acceptor",
    "Arbiter",
    "Drafter",
    "ExitAdapter",
    "FeatureDrafter",
    "FeatureLM",
    "Generation",
    "HFLM",
    "HybridDrafter",
    "LM",
    "LayerSkipDrafter",
    "Lookahead",
    "Lossless",
    "ModelDrafter",
    "PromptLookupDrafter",
    "RestDrafter",
    "Sampling",
    "SelfDrafter",
    "StatefulLM",
    "Stats",
    "SuffixDrafter",
    "TokenRecycling",
    "Tree",
    "TreeDrafter",
    "checkpoints",
    "generate",
    "generate_batch",
    "heads",
    "load",
    "load_head",
]
