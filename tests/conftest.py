"""Shared fixtures: the pinned source and one real CPU build, shared by every test module.

The build is cached under $TQGGUF_CACHE (set by .ci/run to a fresh folder per CI run), so the
first module that needs it pays for it and the others reuse it. For quick local runs,
TQGGUF_TEST_SOURCE / TQGGUF_TEST_BIN_DIR may point at an existing tree / binaries folder.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def load_script():
    """A function that imports a file outside the package (a script, an experiment) by path, as a fresh module
    named after the file."""

    def load(path: Path):
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(scope="session")
def pin():
    from tqgguf.pin import load_pin

    return load_pin()


@pytest.fixture(scope="session")
def pinned(pin):
    """The pinned, verified, extracted source (tqgguf.source.Source)."""
    from tqgguf.source import pinned_source

    return pinned_source(pin)


@pytest.fixture(scope="session")
def llama_source(request) -> Path:
    env = os.environ.get("TQGGUF_TEST_SOURCE")
    return Path(env) if env else request.getfixturevalue("pinned").root


@pytest.fixture(scope="session")
def cpu_build(pin, pinned):
    """One real CPU build of the pinned source with the series applied (tqgguf.build.BuildResult)."""
    from tqgguf.build import BuildSpec, run_build

    return run_build(pinned, pin, BuildSpec(backends=["cpu"]), jobs=os.cpu_count())


@pytest.fixture(scope="session")
def llama_bin(request):
    """name -> path of a built binary."""
    env = os.environ.get("TQGGUF_TEST_BIN_DIR")
    bin_dir = Path(env) if env else request.getfixturevalue("cpu_build").bin_dir

    def get(name: str) -> Path:
        path = bin_dir / name
        assert path.is_file(), f"{name} not built in {bin_dir}"
        return path

    return get


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    """WikiText-2 test text when ../shared/data has it, else an English text made by tqgguf.textdata."""
    from tqgguf.textdata import eval_text

    return eval_text(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="session")
def bindings(cpu_build, pin, pinned, tmp_path_factory) -> Path:
    """llama-cpp-python installed (`--target`) into a temporary folder, bound to the shared CPU build."""
    from tqgguf.bindings import install_bindings
    from tqgguf.build import work_tree

    target = tmp_path_factory.mktemp("site")
    install_bindings(pin, work_tree(pinned), cpu_build.bin_dir, target=target)
    return target
