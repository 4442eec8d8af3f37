"""Architecture analysis of a model release, in pure Python (no torch, no Django).

Importing it is cheap: the defaults a family's config class applies are read from the installed
transformers on the first analysis that needs them (transformers_defaults.py), which imports
transformers (and torch) once per process.

`analyze_config(config, weights=...)` reads a Hugging Face `config.json` (and the fetch
stage's safetensors summary) and returns an `ArchitectureAnalysis`: attention kind and layer
pattern, RoPE, MoE layout, quantization, total/active parameters, checkpoint bytes and KV-cache
bytes. `compare_with_known` says what a release has that earlier ones did not.
"""

from .analysis import ArchitectureAnalysis, analyze_config
from .errors import AnalysisError
from .novelty import compare_with_known

__all__ = ["AnalysisError", "ArchitectureAnalysis", "analyze_config", "compare_with_known"]
