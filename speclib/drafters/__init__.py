"""Drafters propose a Tree from the context (the `Drafter` protocol in speclib.core.protocols): model
drafters (a separate model, the target's own layers, a feature head) and training-free ones (caches of
the prompt and output, Token Recycling, REST, Lookahead), and HVD, which chooses among them per step."""

from speclib.drafters.cache import PromptLookupDrafter, SuffixDrafter
from speclib.drafters.feature import FeatureDrafter, frequent_tokens
from speclib.drafters.hybrid import Costs, HybridDrafter, PayoffPredictor
from speclib.drafters.layers import ExitAdapter, LayerSkipDrafter
from speclib.drafters.lookahead import Lookahead
from speclib.drafters.model import ModelDrafter, SelfDrafter
from speclib.drafters.overlap import OverlapDrafter
from speclib.drafters.recycling import TokenRecycling
from speclib.drafters.rest import Datastore, RestDrafter
from speclib.drafters.tree import TreeDrafter

__all__ = [
    "Costs",
    "Datastore",
    "ExitAdapter",
    "FeatureDrafter",
    "HybridDrafter",
    "LayerSkipDrafter",
    "Lookahead",
    "ModelDrafter",
    "OverlapDrafter",
    "PayoffPredictor",
    "PromptLookupDrafter",
    "RestDrafter",
    "SelfDrafter",
    "SuffixDrafter",
    "TokenRecycling",
    "TreeDrafter",
    "frequent_tokens",
]
