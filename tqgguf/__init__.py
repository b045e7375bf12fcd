"""tqgguf: TurboQuant KV-cache compression for llama.cpp."""

__version__ = "0.1.0"
