"""Our own forwards: families whose decoding state an HF cache cannot branch (hybrid), and a lean
Llama forward with less per-call overhead than the stock one (floor 3)."""
from .hybrid import STRATEGIES, HybridLM, tiny_config
from .llama import LlamaLM

__all__ = ["HybridLM", "LlamaLM", "STRATEGIES", "tiny_config"]
