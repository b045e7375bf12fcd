"""`tqgguf convert`: a Hugging Face model folder to GGUF with the pinned tree's convert_hf_to_gguf.py.

The script runs in this Python (so the `convert` extra's torch/transformers are used) with the pinned tree's own
gguf-py first on PYTHONPATH (PyPI gguf lacks symbols the script uses), offline (HF_HUB_OFFLINE), writing to a
temporary name that is renamed only when the result reads back as a valid GGUF.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from .errors import TqError

OUTTYPES = ("f16", "bf16", "q8_0", "f32", "auto")
# what convert_hf_to_gguf.py imports for a plain text model: module -> pip requirement (pyproject's `convert` extra)
NEEDED = {"torch": "torch==2.13.0", "transformers": "transformers==4.57.6", "sentencepiece": "sentencepiece",
          "safetensors": "safetensors"}
INSTALL_HINT = ("pip install 'tqgguf[convert]'  (from a checkout: pip install -e '.[convert]'; it pins torch==2.13.0, "
                "never a plain `torch`, which pulls a multi-GB CUDA build)")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin", "consolidated*.pth")
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "vocab.json", "tiktoken.model", "tokenizer.tiktoken")


def missing_modules() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def check_hf_dir(hf_dir: Path) -> dict:
    """config.json (with `architectures`), weights and a tokenizer must be there; returns the config."""
    if not hf_dir.is_dir():
        raise TqError(f"{hf_dir} is not a folder", "give the folder of a Hugging Face model (config.json, weights, tokenizer)")
    cfg_path = hf_dir / "config.json"
    if not cfg_path.is_file():
        raise TqError(f"{hf_dir} has no config.json: not a Hugging Face model folder")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TqError(f"{cfg_path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict) or not cfg.get("architectures"):
        raise TqError(f"{cfg_path} names no `architectures`", "the converter picks the model class from it")
    if not any(any(hf_dir.glob(g)) for g in WEIGHT_GLOBS):
        raise TqError(f"{hf_dir} has no weights (*.safetensors or pytorch_model*.bin)")
    if not any((hf_dir / t).is_file() for t in TOKENIZER_FILES):
        raise TqError(f"{hf_dir} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])} or vocab.json)",
                      "copy the tokenizer files of the model next to its weights")
    return cfg


def _error_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error:" in ln or "not supported" in ln or "not recognized" in ln:
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


def preflight(hf_dir: Path, outtype: str) -> dict:
    """Everything that can be checked before the pinned source is needed: options, the folder, the extra."""
    if outtype not in OUTTYPES:
        raise TqError(f"unknown --outtype {outtype!r}", f"choose from {', '.join(OUTTYPES)}")
    cfg = check_hf_dir(hf_dir)
    missing = missing_modules()
    if missing:
        raise TqError(f"convert needs {', '.join(missing)} (not installed in {sys.prefix})", INSTALL_HINT)
    return cfg


def convert(hf_dir: Path, out: Path, outtype: str, llama_src: Path, log=lambda s: None) -> Path:
    hf_dir, out = hf_dir.expanduser().resolve(), out.expanduser().resolve()
    cfg = preflight(hf_dir, outtype)
    script, gguf_py = llama_src / "convert_hf_to_gguf.py", llama_src / "gguf-py"
    if not script.is_file() or not gguf_py.is_dir():
        raise TqError(f"{llama_src} has no convert_hf_to_gguf.py and gguf-py/", "is this a llama.cpp tree?")
    if not out.parent.is_dir():
        raise TqError(f"output folder {out.parent} does not exist")
    part = out.with_name(out.name + ".part")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(gguf_py), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("NO_LOCAL_GGUF", None)
    cmd = [sys.executable, str(script), str(hf_dir), "--outfile", str(part), "--outtype", outtype]
    log(f"converting {hf_dir.name} ({', '.join(cfg['architectures'])}) to {outtype} ...")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(hf_dir), errors="replace")
    except OSError as e:
        raise TqError(f"cannot run {script.name}: {e}") from None
    output = r.stdout + r.stderr
    if r.returncode != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise TqError(f"convert_hf_to_gguf.py failed (exit {r.returncode}): {_error_line(output)}")
    from .gguf_read import GgufError, read_gguf

    try:
        read_gguf(part)
    except GgufError as e:
        part.unlink(missing_ok=True)
        raise TqError(f"the converter wrote an unreadable file: {e}") from None
    os.replace(part, out)
    return out
