"""Drafters propose a Tree from the context: `reset(prompt)`, `draft(context) -> Tree`,
`observe(accepted_tokens)`, `check_compatible(target)`."""
from .branches import BranchSkipLM
from .cache import PromptLookupDrafter, SuffixDrafter
from .feature import FeatureDrafter, HeadLM, frequent_tokens
from .hybrid import Costs, HybridDrafter, PayoffPredictor
from .layers import ExitAdapter, LayerSkipDrafter
from .lookahead import Lookahead
from .model import ModelDrafter, SelfDrafter
from .recycling import TokenRecycling
from .rest import Datastore, RestDrafter
from .tree import TreeDrafter

__all__ = ["Costs", "FeatureDrafter", "HeadLM", "frequent_tokens", "HybridDrafter", "Lookahead", "ModelDrafter", "PayoffPredictor", "PromptLookupDrafter", "RestDrafter", "SelfDrafter",
           "SuffixDrafter", "TokenRecycling", "TreeDrafter"]
__all__ += ["Datastore", "BranchSkipLM", "ExitAdapter", "LayerSkipDrafter"]
