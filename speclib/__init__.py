"""speclib: speculative decoding from scratch, as a research workbook.

    target = speclib.load("code-target"); draft = speclib.load("code-draft")
    out = speclib.generate(target, target.encode("def f(x):\\n"), 64,
                           drafter=speclib.ModelDrafter(draft, k=4), sampling=speclib.Sampling(0.0))
"""
from . import data, device, stats
from .acceptance import Lossless
from .drafters import (FeatureDrafter, HybridDrafter, Lookahead, ModelDrafter, PromptLookupDrafter, RestDrafter, SelfDrafter,
                       SuffixDrafter, TokenRecycling, TreeDrafter)
from .drafters import ExitAdapter, LayerSkipDrafter
from .generate import Generation, generate, generate_batch
from .heads import heads, load_head
from .lm import HFLM, checkpoints
from .loading import load
from .protocols import LM, Acceptor, Drafter, FeatureLM
from .sampling import Sampling
from .stateful import StatefulLM
from .tree import Tree

__all__ = ["Acceptor", "Drafter", "FeatureDrafter", "FeatureLM", "LM", "HFLM", "Generation", "HybridDrafter", "Lookahead", "Lossless", "ModelDrafter", "PromptLookupDrafter", "RestDrafter", "SelfDrafter",
           "Sampling", "StatefulLM", "SuffixDrafter", "TokenRecycling", "Tree", "TreeDrafter", "checkpoints", "data", "generate", "generate_batch", "heads", "load",
           "load_head", "stats"]
__all__ += ["ExitAdapter", "LayerSkipDrafter"]
