#!/usr/bin/env python3
"""Write tqgguf/data/arch_required.json: the metadata keys llama.cpp requires, per architecture of arch_defaults.json.

For each architecture of that table it finds the model class (src/llama-model.cpp llama_model_mapping), and in its
load_arch_hparams (src/models/*.cpp) the metadata keys read without `false` (required) at the function's top level
(keys read inside an `if` are required only sometimes and are left out). Key names come from src/llama-arch.cpp.

usage: scripts/gen_arch_required.py [LLAMA_CPP_TREE] [--check]
  LLAMA_CPP_TREE defaults to the pinned source (`tqgguf source`); --check only compares (exit 1 when out of date).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tqgguf" / "data"
TABLE, OUT = DATA / "arch_defaults.json", DATA / "arch_required.json"


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--check"]
    root = Path(args[0]) if args else Path(
        subprocess.run([sys.executable, "-m", "tqgguf", "source"], capture_output=True, text=True, check=True).stdout.strip())
    arch_src = (root / "src" / "llama-arch.cpp").read_text()
    arch_names = dict(re.findall(r"\{\s*(LLM_ARCH_\w+),\s*\"([^\"]+)\"\s*\}", arch_src))
    kv_names = dict(re.findall(r"\{\s*(LLM_KV_\w+),\s*\"([^\"]+)\"\s*\}", arch_src))
    mapping = dict(re.findall(r"case (LLM_ARCH_\w+):\s*return new (llama_model_\w+)\(",
                              (root / "src" / "llama-model.cpp").read_text()))
    bodies: dict[str, str] = {}
    for f in sorted((root / "src" / "models").glob("*.cpp")):
        for m in re.finditer(r"void (llama_model_\w+)::load_arch_hparams\([^)]*\)\s*\{\n(.*?)\n\}\n", f.read_text(), re.S):
            bodies[m[1]] = m[2]
    archs = json.loads(TABLE.read_text())["archs"]
    by_name = {name: arch for arch, name in arch_names.items()}
    required: dict[str, list[str]] = {}
    for name in archs:
        cls = mapping.get(by_name.get(name, ""))
        body = bodies.get(cls or "", "")
        keys: list[str] = []
        for call in re.finditer(r"^    ml\.(?:get_key|get_arr|get_key_or_arr)\((LLM_KV_\w+),([^;]*)\);", body, re.M):
            key = kv_names.get(call[1], "").replace("%s.", "")
            if key and "false" not in call[2] and key not in keys:
                keys.append(key)
        if keys:
            required[name] = keys
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(required.items())]
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    if "--check" in sys.argv:
        if OUT.read_text() != text:
            sys.exit(f"{OUT} is out of date for {root}: run scripts/gen_arch_required.py")
        print(f"{OUT.name} is up to date")
        return
    OUT.write_text(text)
    print(f"wrote {OUT}: required keys for {len(required)} of {len(archs)} architectures")

if __name__ == "__main__":
    main()
