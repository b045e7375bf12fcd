"""`tqgguf build --python`: llama-cpp-python bindings that use our patched libllama.

The bindings come from the same pinned sdist as the source. They are installed with
`-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF` (Python only: nothing is compiled twice), and two small
edits are made to `llama_cpp/llama_cpp.py` before installing:

* the default library folder (used when $LLAMA_CPP_LIB_PATH is unset) becomes our build's `bin/`,
  so `import llama_cpp` loads the patched libllama without any environment variable;
* the `GGML_TYPE_*` constants learn the types our series adds (read from the patched `ggml.h`), so
  `Llama(..., type_k=llama_cpp.GGML_TYPE_TURBO3_0)` works like any upstream type.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .errors import TqError
from .pin import Pin
from .source import fetch_sdist

MARK = "# tqgguf:"


def ggml_types(ggml_h: Path) -> dict[str, int]:
    """`GGML_TYPE_NAME = N` entries of `enum ggml_type` in a ggml.h."""
    text = ggml_h.read_text()
    m = re.search(r"enum ggml_type \{(.*?)\};", text, re.S)
    if not m:
        raise TqError(f"cannot find enum ggml_type in {ggml_h}")
    return {k: int(v) for k, v in re.findall(r"(GGML_TYPE_\w+)\s*=\s*(\d+)", m.group(1))}


def patch_llama_cpp_py(text: str, lib_dir: Path, types: dict[str, int]) -> str:
    """The two edits described in the module docstring; idempotent, and strict about the anchors."""
    if MARK in text:
        return text
    anchor = '_override_base_path = os.environ.get("LLAMA_CPP_LIB_PATH")'
    if anchor not in text:
        raise TqError("llama_cpp.py has changed: cannot find the LLAMA_CPP_LIB_PATH lookup")
    text = text.replace(anchor, f'_override_base_path = os.environ.get("LLAMA_CPP_LIB_PATH", {str(lib_dir)!r})  {MARK} patched build')
    known = set(re.findall(r"^(GGML_TYPE_\w+) = \d+$", text, re.M))
    new = {k: v for k, v in types.items() if k not in known and k != "GGML_TYPE_COUNT"}
    m = re.search(r"^GGML_TYPE_COUNT = \d+$", text, re.M)
    if not m:
        raise TqError("llama_cpp.py has changed: cannot find GGML_TYPE_COUNT")
    lines = "".join(f"{k} = {v}  {MARK} added by the patch series\n" for k, v in sorted(new.items(), key=lambda kv: kv[1]))
    count = f"GGML_TYPE_COUNT = {types.get('GGML_TYPE_COUNT', max(types.values()) + 1)}"
    return text[:m.start()] + lines + count + text[m.end():]


def install_bindings(pin: Pin, work_tree: Path, bin_dir: Path, log=lambda s: None, target: Path | None = None) -> str:
    """pip-install the pinned llama-cpp-python into this Python (or `--target` a folder), bound to `bin_dir`."""
    if not (bin_dir / "libllama.so").exists() and not list(bin_dir.glob("libllama*")):
        raise TqError(f"no libllama in {bin_dir}", "the build must use BUILD_SHARED_LIBS=ON (tqgguf's default)")
    archive = fetch_sdist(pin, log)
    types = ggml_types(work_tree / "ggml" / "include" / "ggml.h")
    top = archive.name.removesuffix(".tar.gz")
    with tempfile.TemporaryDirectory(prefix="tqgguf-py-") as tmp:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if not m.name.startswith(f"{top}/vendor/")]
            tar.extractall(tmp, members=members, filter="data")
        pkg = Path(tmp) / top
        module = pkg / "llama_cpp" / "llama_cpp.py"
        module.write_text(patch_llama_cpp_py(module.read_text(), bin_dir, types))
        env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
        log(f"installing {pin.pip_spec} (Python only) bound to {bin_dir} ...")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                            "--force-reinstall", *(["--target", str(target)] if target else []), str(pkg)],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            tail = "\n  ".join((r.stderr or r.stdout).strip().splitlines()[-8:])
            raise TqError(f"pip could not install the bindings:\n  {tail}", "check network access to your pip index")
    return pin.version
