"""Python bindings: llama-cpp-python from the pinned sdist, bound to our build, knowing the series' types."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

from tqgguf.bindings import ggml_types, patch_llama_cpp_py
from tqgguf.errors import TqError


@pytest.fixture(scope="module")
def llama_cpp_py(pin, pinned):
    from tqgguf.source import sdist_path

    top = pin.filename.removesuffix(".tar.gz")
    with tarfile.open(sdist_path(pin), "r:gz") as tar:
        return tar.extractfile(f"{top}/llama_cpp/llama_cpp.py").read().decode()


def test_patch_llama_cpp_py(llama_cpp_py, tmp_path):
    types = {"GGML_TYPE_F32": 0, "GGML_TYPE_Q2_0": 42, "GGML_TYPE_NEW_A": 43, "GGML_TYPE_NEW_B": 44,
             "GGML_TYPE_COUNT": 45}
    out = patch_llama_cpp_py(llama_cpp_py, tmp_path / "bin", types)
    assert f'os.environ.get("LLAMA_CPP_LIB_PATH", {str(tmp_path / "bin")!r})' in out
    assert "\nGGML_TYPE_NEW_A = 43" in out and "\nGGML_TYPE_NEW_B = 44" in out and "\nGGML_TYPE_COUNT = 45" in out
    assert out.count("\nGGML_TYPE_Q2_0 = 42") == 1
    assert patch_llama_cpp_py(out, tmp_path / "other", types) == out  # idempotent
    with pytest.raises(TqError):
        patch_llama_cpp_py("nothing here", tmp_path, types)


def test_ggml_types_of_the_pinned_header(pinned):
    types = ggml_types(pinned.root / "ggml" / "include" / "ggml.h")
    assert types["GGML_TYPE_Q8_0"] == 8 and types["GGML_TYPE_Q2_0"] == 42 and types["GGML_TYPE_COUNT"] == 43


@pytest.mark.build
def test_bindings_load_smollm2_on_our_build(bindings, cpu_build, pinned):
    """Install the bindings into a folder, import them in a fresh Python, load SmolLM2 with a turbo4 K and
    turbo3 V cache and generate."""
    from tqgguf.build import work_tree
    from tqgguf.models import smollm2_path

    target = bindings
    types = ggml_types(work_tree(pinned) / "ggml" / "include" / "ggml.h")
    assert types["GGML_TYPE_TURBO3_0"] == 44 and types["GGML_TYPE_TURBO4_0"] == 45
    code = f"""
import llama_cpp, os
assert os.path.dirname(llama_cpp.llama_cpp._lib._name) == {str(cpu_build.bin_dir)!r}, llama_cpp.llama_cpp._lib._name
for name, value in {types!r}.items():
    assert getattr(llama_cpp, name) == value, name
llm = llama_cpp.Llama({str(smollm2_path())!r}, n_ctx=256, n_threads=2, verbose=False, seed=1,
                      type_k=llama_cpp.GGML_TYPE_TURBO4_0, type_v=llama_cpp.GGML_TYPE_TURBO3_0, flash_attn=True)
out = llm("The capital of France is", max_tokens=8, temperature=0)
text = out["choices"][0]["text"]
assert out["usage"]["completion_tokens"] > 0 and text.strip(), out
print("OK", repr(text))
"""
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("LLAMA_CPP_LIB_PATH", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]
