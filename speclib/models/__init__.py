"""Our own forwards for model families whose decoding state an HF cache cannot branch (floor 3)."""
from .hybrid import STRATEGIES, HybridLM, tiny_config

__all__ = ["HybridLM", "STRATEGIES", "tiny_config"]
