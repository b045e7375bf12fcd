"""Build driver: CMake arguments per backend (golden), progress parsing on a real log, one real CPU build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tqgguf.build import SMOKE, BuildSpec, cmake_args, run_build
from tqgguf.errors import TqError
from tqgguf.progress import error_lines, parse_line

REPO = Path(__file__).resolve().parent.parent

DATA = Path(__file__).parent / "data"

COMMON = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON",
]


@pytest.mark.parametrize("backends,kw,extra", [
    (["cpu"], {}, []),
    (["cuda"], {"cuda_arch": "90"}, ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_CUDA_COMPRESSION_MODE=none", "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0,f16-q8_0,q8_0-f16,q4_0-q4_0,bf16-bf16"]),
    (["cuda"], {}, ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native", "-DGGML_CUDA_COMPRESSION_MODE=none", "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0,f16-q8_0,q8_0-f16,q4_0-q4_0,bf16-bf16"]),
    (["cuda"], {"cuda_arch": "90-real", "cuda_compression": "size"},
     ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90-real", "-DGGML_CUDA_COMPRESSION_MODE=size", "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0,f16-q8_0,q8_0-f16,q4_0-q4_0,bf16-bf16"]),
    (["hip"], {"hip_arch": "gfx1100"}, ["-DGGML_HIP=ON", "-DGPU_TARGETS=gfx1100", "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0,f16-q8_0,q8_0-f16,q4_0-q4_0,bf16-bf16"]),
    (["vulkan"], {}, ["-DGGML_VULKAN=ON"]),
    (["vulkan", "cuda", "cpu"], {"cuda_arch": "89"},
     ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=89", "-DGGML_CUDA_COMPRESSION_MODE=none", "-DGGML_CUDA_FA_QUANTS=q8_0-q8_0,f16-q8_0,q8_0-f16,q4_0-q4_0,bf16-bf16", "-DGGML_VULKAN=ON"]),
])
def test_cmake_args_golden(backends, kw, extra):
    assert cmake_args(BuildSpec(backends=backends, **kw)) == COMMON + extra


def test_cmake_args_macos_metal_only_when_asked(monkeypatch):
    """ggml builds Metal by default on Apple machines; a build without -b metal turns it off, so that the build has
    the backends its manifest names (a CPU build that offloaded to Metal would write turbo caches where Metal has no
    kernels, unchecked)."""
    monkeypatch.setattr(sys, "platform", "darwin")
    assert cmake_args(BuildSpec()) == COMMON + ["-DGGML_METAL=OFF"]
    assert cmake_args(BuildSpec(backends=["vulkan"]))[-2:] == ["-DGGML_VULKAN=ON", "-DGGML_METAL=OFF"]
    metal = cmake_args(BuildSpec(backends=["metal"]))
    assert metal[-2:] == ["-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"] and "-DGGML_METAL=OFF" not in metal


def test_spec_validation():
    assert BuildSpec(backends=["vulkan", "cuda"]).backends == ["cpu", "cuda", "vulkan"]
    assert "-DGGML_NATIVE=OFF" in cmake_args(BuildSpec(native=False))
    assert cmake_args(BuildSpec(build_type="Debug"))[0] == "-DCMAKE_BUILD_TYPE=Debug"
    with pytest.raises(TqError):
        BuildSpec(backends=["opencl"])
    with pytest.raises(TqError):
        BuildSpec(build_type="Fast")
    with pytest.raises(TqError, match="compression"):
        BuildSpec(backends=["cuda"], cuda_compression="fast")
    if sys.platform != "darwin":
        with pytest.raises(TqError):
            BuildSpec(backends=["metal"])


def test_progress_parsing_on_recorded_log():
    """A real Ninja log of the pinned tree (recorded on this project's CI-sized machine)."""
    lines = (DATA / "ninja-build.log").read_text().splitlines()
    steps = [s for s in map(parse_line, lines) if s]
    assert len(steps) >= 100
    assert steps[0].done == 1 and all(s.total == steps[0].total for s in steps)
    assert [s.done for s in steps] == sorted(s.done for s in steps)
    assert steps[-1].done == steps[-1].total
    assert any(s.what == "llama-model.cpp" for s in steps)
    assert parse_line("[ 45%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o").done == 45
    assert parse_line("-- Configuring done") is None


def test_error_lines_pick_the_cause():
    log = ("[1/3] Building C object a.o\nFAILED: a.o\n/x/a.c:3:5: error: unknown type name 'foo'\n"
           "cc1: warning: something\nninja: build stopped: subcommand failed.\n")
    got = error_lines(log)
    assert got[0] == "FAILED: a.o" and "unknown type name" in got[1] and not any("warning" in g for g in got)
    # CMake: the message after each header, once; llama.cpp's build-info probing of a tree without .git left out
    cmake = ("fatal: not a git repository (or any of the parent directories): .git\n"
             "CMake Error in ggml/src/ggml-cuda/CMakeLists.txt:\n"
             "  CUDA_ARCHITECTURES is set to \"native\", but no GPU was detected.\n\n\n"
             "CMake Error in ggml/src/ggml-cuda/CMakeLists.txt:\n"
             "  CUDA_ARCHITECTURES is set to \"native\", but no GPU was detected.\n")
    assert error_lines(cmake) == ['CMake Error in ggml/src/ggml-cuda/CMakeLists.txt: CUDA_ARCHITECTURES is set to '
                                  '"native", but no GPU was detected.']


@pytest.mark.build
def test_real_cpu_build_and_noop_rebuild(cpu_build, pin, pinned):
    m = cpu_build.manifest
    assert m["source"]["sha256"] == pin.sha256 and m["source"]["commit"] == pin.upstream_commit
    assert [p["name"] for p in m["patches"]] == pin.series
    assert m["smoke"] and all(v == "ok" for v in m["smoke"].values()), m["smoke"]
    assert set(SMOKE) <= set(m["binaries"])
    for path in m["binaries"].values():
        assert Path(path).is_file()
    assert json.loads((cpu_build.bin_dir / "tqgguf-manifest.json").read_text())["cmake_args"] == m["cmake_args"]
    # The series really is applied in the tree that was built.
    from tqgguf.build import work_tree
    vk = (work_tree(pinned) / "ggml/src/ggml-vulkan/ggml-vulkan.cpp").read_text()
    assert "#ifdef VK_EXT_layer_settings" in vk
    # Building again changes no file and runs no build step.
    again = run_build(pinned, pin, BuildSpec(backends=["cpu"]))
    assert again.changed_files == [] and again.steps == 0
    assert again.build_dir == cpu_build.build_dir


def test_cli_bad_cuda_compression_is_one_line():
    """A bad --cuda-compression is refused before anything is fetched or built: exit 2, the modes named."""
    r = subprocess.run([sys.executable, "-m", "tqgguf", "build", "-b", "cuda", "--cuda-compression", "fast"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "compression mode 'fast'" in r.stderr and "none, speed, balance, size" in r.stderr


@pytest.mark.build
def test_print_bin(cpu_build):
    r = subprocess.run([sys.executable, "-m", "tqgguf", "build", "--print-bin", "llama-server"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == cpu_build.bin_dir / "llama-server"
    r = subprocess.run([sys.executable, "-m", "tqgguf", "build", "--print-bin", "no-such-tool"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no-such-tool is not in the cpu build" in r.stderr


@pytest.mark.build
def test_prepare_h200_slim_tree(cpu_build, tmp_path, load_script):
    """scripts/prepare_h200.py: the patched tree fits a device run (under 60 MiB) and still has what the run needs."""
    mod = load_script(REPO / "scripts" / "prepare_h200.py")
    out = tmp_path / "h200"
    assert mod.main(["--out", str(out)]) == 0
    tree = out / "llama.cpp"
    assert (tree / "CMakeLists.txt").is_file()
    assert sorted(p.name for p in (tree / "models").iterdir()) == ["ggml-vocab-llama-bpe.gguf"]
    assert (tree / "gguf-py" / "gguf" / "constants.py").is_file()
    assert "TURBO3_0" in (tree / "gguf-py" / "gguf" / "constants.py").read_text()  # patched
    assert (tree / "ggml" / "src" / "ggml-cuda" / "fattn-turbo.cuh").is_file()
    assert (tree / "ggml" / "src" / "ggml-cuda" / "fattn-turbo-mma.cuh").is_file()
    # the 21 K/V pairs with a turbo side, and q8_0/q8_0 (patch 0054)
    inst_dir = tree / "ggml" / "src" / "ggml-cuda" / "template-instances"
    instances = sorted(p.name for p in inst_dir.glob("fattn-turbo-instance-*.cu"))
    assert len(instances) == 22 and "fattn-turbo-instance-q8_0-q8_0.cu" in instances
    for gone in ("docs", ".git", "examples", "tools/ui", "ggml/src/ggml-vulkan"):
        assert not (tree / gone).exists(), gone
    args = (out / "cmake-args.txt").read_text().split()
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in args
    assert "-DGGML_CUDA_COMPRESSION_MODE=none" in args
    assert (out / "commit.txt").read_text().strip()
    wiki = REPO.parent / "shared" / "data" / "wikitext-2-raw-test.txt"
    if wiki.is_file():  # the parity and diag steps' text: the first 300 kB
        assert (out / "wiki-300k.txt").read_bytes() == wiki.read_bytes()[:300_000]
    else:
        assert not (out / "wiki-300k.txt").exists()
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    assert size < 60 * 2**20



def test_prepare_h200_pristine(pin, pinned, tmp_path, load_script):
    """prepare_h200.py --pristine (for scripts/gpu_cli.sh): an unpatched slim tree that the series applies to, with
    llama-server's ui folder, and requests importable from pydeps/."""
    import tarfile

    from tqgguf.patches import check_series

    mod = load_script(REPO / "scripts" / "prepare_h200.py")
    out = tmp_path / "h200"
    assert mod.main(["--out", str(out), "--pristine"]) == 0
    assert (out / "pristine.tar.gz").stat().st_size < 20 * 2**20 and not (out / "llama.cpp").exists()
    with tarfile.open(out / "pristine.tar.gz") as tf:
        tf.extractall(tmp_path / "x", filter="data")
    tree = tmp_path / "x" / "llama.cpp"
    assert "TURBO3_0" not in (tree / "gguf-py" / "gguf" / "constants.py").read_text()   # not patched
    assert (tree / "tools" / "ui" / "CMakeLists.txt").is_file() and (tree / "ggml/src/ggml-vulkan").is_dir()
    assert sorted(p.name for p in (tree / "models").iterdir()) == ["ggml-vocab-llama-bpe.gguf"]
    assert not (tree / "docs").exists() and not (tree / "ggml/src/ggml-sycl").exists()
    assert check_series(tree, pin.patch_paths)                                          # the series applies
    r = subprocess.run([sys.executable, "-s", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import requests; "
                        "print(requests.__file__)", str(out / "pydeps")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(str(out / "pydeps")), r.stderr
    assert (out / "commit.txt").read_text().strip()

def test_local_source_edits_are_built(tmp_path, monkeypatch):
    """`tqgguf build --source DIR`: the work copy is keyed by DIR and its git commit (here none), which do not change
    when DIR's files are edited; a rebuild still builds the edited file, and only that."""
    from tqgguf.pin import Pin
    from tqgguf.source import local_source

    monkeypatch.setenv("TQGGUF_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "tree"
    (src / "ggml").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(t C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_executable(hello hello.c)\nadd_executable(other other.c)\n")
    (src / "value.h").write_text("#define VALUE 1\n")
    (src / "hello.c").write_text('#include <stdio.h>\n#include "value.h"\nint main(void) { printf("%d\\n", VALUE); return 0; }\n')
    (src / "other.c").write_text("int main(void) { return 0; }\n")
    pin = Pin(package="p", version="0", filename="p.tar.gz", sha256="0" * 64, subdir="p", upstream_commit="0",
              series=[], path=tmp_path / "source.toml")
    spec = BuildSpec(backends=["cpu"], targets=["hello", "other"])

    def hello(res) -> str:
        return subprocess.run([str(res.bin_dir / "hello")], capture_output=True, text=True, check=True).stdout.strip()

    first = run_build(local_source(src), pin, spec)
    assert hello(first) == "1" and first.steps > 0
    (src / "value.h").write_text("#define VALUE 2\n")
    second = run_build(local_source(src), pin, spec)
    assert second.build_dir == first.build_dir and second.changed_files == ["value.h"]
    assert hello(second) == "2"
    assert 0 < second.steps < first.steps                  # hello.c again and its link, not other.c


def test_find_bin_takes_a_build_of_the_same_backends_with_other_flags(tmp_path, monkeypatch):
    """`tqgguf build -b cuda --cuda-arch 90-real` (the README's example) and then `tqgguf serve -b cuda`, which
    knows only the backends: the build with other flags is found (the newest one with the binary), never one of
    other backends or of another source."""
    from tqgguf.build import build_dir, find_bin
    from tqgguf.source import Source

    monkeypatch.setenv("TQGGUF_CACHE", str(tmp_path))
    src = Source(root=tmp_path / "src", kind="sdist", key="abc123", commit="0")
    other = Source(root=tmp_path / "other", kind="sdist", key="def456", commit="0")

    def fake(source, spec, when, binaries):
        b = build_dir(source, spec) / "bin"
        b.mkdir(parents=True)
        for name in binaries:
            (b / name).write_text("")
        (b / "tqgguf-manifest.json").write_text(json.dumps({
            "source": {"key": source.key}, "backends": spec.backends, "build_dir": str(b.parent), "built_at": when,
            "binaries": {n: str(b / n) for n in binaries}}))
        return b

    with pytest.raises(TqError, match="no cpu\\+cuda build found"):
        find_bin(src, BuildSpec(backends=["cuda"]), "llama-server")
    fake(src, BuildSpec(backends=["vulkan"]), "2026-01-05T00:00:00Z", ["llama-server"])
    fake(other, BuildSpec(backends=["cuda"], cuda_arch="89"), "2026-01-06T00:00:00Z", ["llama-server"])
    with pytest.raises(TqError, match="no cpu\\+cuda build found"):
        find_bin(src, BuildSpec(backends=["cuda"]), "llama-server")
    old = fake(src, BuildSpec(backends=["cuda"], cuda_arch="80"), "2026-01-01T00:00:00Z", ["llama-server", "llama-bench"])
    new = fake(src, BuildSpec(backends=["cuda"], cuda_arch="90-real"), "2026-01-02T00:00:00Z", ["llama-server"])
    assert find_bin(src, BuildSpec(backends=["cuda"]), "llama-server") == new / "llama-server"
    assert find_bin(src, BuildSpec(backends=["cuda"]), "llama-bench") == old / "llama-bench"   # the one that has it
    exact = fake(src, BuildSpec(backends=["cuda"]), "2025-12-01T00:00:00Z", ["llama-server"])
    assert find_bin(src, BuildSpec(backends=["cuda"]), "llama-server") == exact / "llama-server"  # the spec's own
    assert find_bin(src, BuildSpec(backends=["cuda"], cuda_arch="80"), "llama-server") == old / "llama-server"
    with pytest.raises(TqError, match="llama-cli is not in the cpu\\+cuda build") as e:
        find_bin(src, BuildSpec(backends=["cuda"]), "llama-cli")
    assert e.value.hint.startswith("`tqgguf build -b cuda` builds it")
    with pytest.raises(TqError) as e:
        find_bin(src, BuildSpec(backends=["vulkan", "cuda"]), "llama-server")
    assert e.value.message == "no cpu+cuda+vulkan build found" and e.value.hint == "run `tqgguf build -b cuda -b vulkan` first"


def test_a_patches_apply_tree_is_built_as_it_is(tmp_path, monkeypatch, pin):
    """`tqgguf build --source DIR` on a tree made by `tqgguf patches apply DIR` (the maintenance loop): the series is
    in its commits already, so it is built as it is, edits and new commits included, in one work copy and build
    folder; the manifest lists its commits on the base tag."""
    from tqgguf.patches import init_repo
    from tqgguf.source import local_source

    monkeypatch.setenv("TQGGUF_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "tree"
    (src / "ggml").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(t C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\nadd_executable(hello hello.c)\n")
    (src / "hello.c").write_text('#include <stdio.h>\nint main(void) { printf("1\\n"); return 0; }\n')
    init_repo(src, "upstream")
    env = dict(os.environ, GIT_AUTHOR_NAME="d", GIT_AUTHOR_EMAIL="d@example.invalid", GIT_COMMITTER_NAME="d",
               GIT_COMMITTER_EMAIL="d@example.invalid", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_CEILING_DIRECTORIES=str(tmp_path))
    (src / "hello.c").write_text('#include <stdio.h>\nint main(void) { printf("2\\n"); return 0; }\n')
    subprocess.run(["git", "commit", "-qam", "hello: print 2"], cwd=src, env=env, check=True)
    spec = BuildSpec(backends=["cpu"], targets=["hello"])

    def hello(res) -> str:
        return subprocess.run([str(res.bin_dir / "hello")], capture_output=True, text=True, check=True).stdout.strip()

    source = local_source(src)
    assert source.series_in_tree
    first = run_build(source, pin, spec)                 # the real series would not apply here: it is not applied
    assert hello(first) == "2"
    assert [p["name"] for p in first.manifest["patches"]] == ["0001 hello: print 2"]
    (src / "hello.c").write_text('#include <stdio.h>\nint main(void) { printf("3\\n"); return 0; }\n')
    subprocess.run(["git", "commit", "-qam", "hello: print 3"], cwd=src, env=env, check=True)
    second = run_build(local_source(src), pin, spec)
    assert second.build_dir == first.build_dir and second.changed_files == ["hello.c"] and hello(second) == "3"
    assert [p["name"] for p in second.manifest["patches"]] == ["0001 hello: print 2", "0002 hello: print 3"]
    assert second.manifest["source"]["commit"] == local_source(src).commit != first.manifest["source"]["commit"]


def test_cuda_without_arch_needs_a_visible_gpu(tmp_path, monkeypatch):
    """`tqgguf build -b cuda` builds for the GPUs here (CMake's native): where nvidia-smi lists none, that is a
    one-line error with the architectures to pass, before anything is fetched or configured (CMake's own message
    came after a minute, among unrelated lines)."""
    from tqgguf.gpu import cuda_archs

    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:/usr/bin:/bin", TQGGUF_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "tqgguf", "build", "-b", "cuda"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2 and "nvidia-smi lists none" in r.stderr and "--cuda-arch: 90" in r.stderr, r.stderr
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    assert cuda_archs() == []
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H100, 9.0, 81559 MiB, 81000 MiB\\nNVIDIA RTX 3090, 8.6, 24576 MiB, 24000 MiB\\n"
                   "NVIDIA H100, 9.0, 81559 MiB, 81000 MiB\\n'\n")
    assert cuda_archs() == ["86", "90"]
