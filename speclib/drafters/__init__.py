"""Drafters propose a Tree from the context: `reset(prompt)`, `draft(context) -> Tree`,
`observe(accepted_tokens)`, `check_compatible(target)`."""
from .cache import PromptLookupDrafter, SuffixDrafter
from .model import ModelDrafter, SelfDrafter
from .tree import TreeDrafter

__all__ = ["ModelDrafter", "PromptLookupDrafter", "SelfDrafter", "SuffixDrafter", "TreeDrafter"]
