"""K/V pairs a GPU build has no flash-attention kernel for are refused before anything runs, and so are turbo
caches on a Metal build's GPU.

Patch 0011 gives every pair of a turbo type with f16, q8_0 or a turbo type a CUDA/HIP kernel; any other partner
(q4_0, bf16, ...) would make llama.cpp run that attention on the CPU and copy the cache every token. Patch 0040 lets
Vulkan's flash attention decode turbo types next to every type it takes but bf16. Metal has no turbo kernels at
all, so llama.cpp cannot even write a turbo cache that lives on its device.
Also: the device a GPU build's results are recorded with is what the tool lists (`--list-devices`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tqgguf import kvcompat
from tqgguf.errors import TqError
from tqgguf.perplexity import CacheConfig
from tqgguf.runinfo import check_gpu_pairs


@pytest.mark.parametrize("k,v,ok", [
    ("turbo3", "turbo3", True), ("q8_0", "turbo4", True), ("turbo4", "f16", True), ("turbo2", "turbo4", True),
    ("f16", "f16", True), ("q4_0", "q4_0", True), ("q8_0", "q4_0", True),   # no turbo side: upstream's business
    ("q4_0", "turbo3", False), ("turbo3", "q4_0", False), ("turbo4", "bf16", False), ("q5_1", "turbo2", False),
])
def test_gpu_pair_error(k, v, ok):
    for backend in ("cuda", "hip"):
        err = kvcompat.gpu_pair_error(k, v, ["cpu", backend])
        assert (err is None) == ok
        if not ok:
            assert f"K {k} / V {v} has no {backend.upper()} flash-attention kernel" in err and "CPU" in err


@pytest.mark.parametrize("k,v,ok", [
    ("turbo3", "turbo3", True), ("q4_0", "turbo3", True), ("turbo2", "q5_1", True), ("iq4_nl", "turbo4", True),
    ("turbo4", "f16", True), ("q8_0", "turbo2", True),
    ("turbo4", "bf16", False), ("bf16", "turbo2", False),            # Vulkan pairs bf16 only with bf16
])
def test_gpu_pair_error_vulkan(k, v, ok):
    err = kvcompat.gpu_pair_error(k, v, ["cpu", "vulkan"])
    assert (err is None) == ok
    if not ok:
        assert f"K {k} / V {v} has no Vulkan flash-attention kernel" in err
    # a build with CUDA and Vulkan is held to both
    assert (kvcompat.gpu_pair_error(k, v, ["cpu", "cuda", "vulkan"]) is None) == (ok and k not in ("q4_0", "q5_1", "iq4_nl")
                                                                                  and v not in ("q4_0", "q5_1", "iq4_nl"))


def test_gpu_offload():
    assert kvcompat.gpu_offload(["cpu", "cuda"], None)
    assert kvcompat.gpu_offload(["cpu", "hip"], "99")
    assert kvcompat.gpu_offload(["cpu", "vulkan"], None)
    assert not kvcompat.gpu_offload(["cpu", "cuda"], "0")
    assert not kvcompat.gpu_offload(["cpu", "cuda"], 0)
    assert not kvcompat.gpu_offload(["cpu"], "99")
    assert not kvcompat.gpu_offload(["cpu", "metal"], None)  # no turbo pairs to tell apart: no_turbo_backend_error


@pytest.mark.parametrize("backends,ngl,types,refused", [
    (["cpu", "metal"], None, ("turbo3", "turbo3"), True),
    (["cpu", "metal"], "99", ("q8_0", "q8_0", "turbo2"), True),    # a boundary-layer turbo V alone
    (["cpu", "metal"], None, ("f16", "turbo4"), True),
    (["cpu", "metal"], "0", ("turbo3", "turbo3"), False),           # everything on the CPU
    (["cpu", "metal"], 0, ("turbo3", "turbo3"), False),
    (["cpu", "metal"], None, ("q8_0", "q4_0"), False),              # upstream's types: Metal has those
    (["cpu", "vulkan"], None, ("turbo3", "turbo3"), False),         # patch 0040
    (["cpu", "cuda"], None, ("turbo3", "turbo3"), False),
    (["cpu"], None, ("turbo3", "turbo3"), False),
])
def test_no_turbo_backend_error(backends, ngl, types, refused):
    err = kvcompat.no_turbo_backend_error(backends, ngl, types)
    assert (err is not None) == refused
    if refused:
        assert "Metal backend has no kernels for" in err
        assert all(t in err for t in types if t.startswith("turbo"))


def _fake_build(tmp_path: Path, backends: list[str]) -> Path:
    binary = tmp_path / "llama-perplexity"
    binary.write_text("")
    (tmp_path / "tqgguf-manifest.json").write_text(json.dumps({"backends": backends}))
    return binary


def test_check_gpu_pairs(tmp_path):
    cfgs = [CacheConfig.parse("turbo4/turbo3"), CacheConfig.parse("q4_0/turbo3")]
    cuda = _fake_build(tmp_path, ["cpu", "cuda"])
    with pytest.raises(TqError, match="config q4_0/turbo3: K q4_0 / V turbo3 has no CUDA flash-attention"):
        check_gpu_pairs(cuda, None, cfgs)
    check_gpu_pairs(cuda, "0", cfgs)          # everything on the CPU: fine
    check_gpu_pairs(cuda, None, cfgs[:1])     # a pair with a kernel: fine
    # the boundary-layer V type pairs with K too
    with pytest.raises(TqError, match="V q4_0"):
        check_gpu_pairs(cuda, None, [CacheConfig.parse("turbo4/turbo2+bv2:q4_0")])
    cpu_dir = tmp_path / "cpu"
    cpu_dir.mkdir()
    check_gpu_pairs(_fake_build(cpu_dir, ["cpu"]), None, cfgs)


def test_check_gpu_pairs_vulkan_and_metal(tmp_path):
    vulkan = _fake_build(tmp_path, ["cpu", "vulkan"])
    check_gpu_pairs(vulkan, None, [CacheConfig.parse("f16"), CacheConfig.parse("turbo4/turbo3"),
                                   CacheConfig.parse("q4_0/turbo3"), CacheConfig.parse("q8_0/q8_0+bv2:turbo2")])
    with pytest.raises(TqError, match="config turbo4/bf16: K turbo4 / V bf16 has no Vulkan") as e:
        check_gpu_pairs(vulkan, None, [CacheConfig.parse("turbo4/bf16")])
    assert e.value.hint == kvcompat.PAIR_HINT
    check_gpu_pairs(vulkan, "0", [CacheConfig.parse("turbo4/bf16")])

    metal_dir = tmp_path / "metal"
    metal_dir.mkdir()
    metal = _fake_build(metal_dir, ["cpu", "metal"])
    with pytest.raises(TqError, match="config turbo4/turbo3: this build's Metal backend has no kernels for turbo3, turbo4") as e:
        check_gpu_pairs(metal, None, [CacheConfig.parse("f16"), CacheConfig.parse("turbo4/turbo3")])
    assert "-ngl 0" in e.value.hint and "-b vulkan" in e.value.hint
    with pytest.raises(TqError, match="turbo2"):     # the boundary layers' V type counts too
        check_gpu_pairs(metal, None, [CacheConfig.parse("q8_0/q8_0+bv2:turbo2")])
    check_gpu_pairs(metal, "0", [CacheConfig.parse("turbo4/turbo3")])
    check_gpu_pairs(metal, None, [CacheConfig.parse("f16"), CacheConfig.parse("q8_0/q4_0")])


def test_serve_precheck_refuses_cpu_fallback_pair():
    from tqgguf.models import smollm2_path
    from tqgguf.serve import make_request, precheck

    model = smollm2_path()
    req = make_request(model, k="q4_0", v="turbo3", backends=["cpu", "cuda"])
    with pytest.raises(TqError, match="cannot run on the GPU"):
        precheck(req)
    precheck(make_request(model, k="q4_0", v="turbo3", backends=["cpu", "cuda"], n_gpu_layers="0"))
    precheck(make_request(model, k="q4_0", v="turbo3", backends=["cpu"]))
    precheck(make_request(model, k="q8_0", v="turbo3", backends=["cpu", "cuda"]))


def test_serve_precheck_turbo_on_vulkan_and_metal():
    from tqgguf.models import smollm2_path
    from tqgguf.serve import make_request, precheck

    model = smollm2_path()
    precheck(make_request(model, k="turbo3", v="turbo3", backends=["cpu", "vulkan"]))
    precheck(make_request(model, k="q4_0", v="turbo3", backends=["cpu", "vulkan"]))
    with pytest.raises(TqError, match="cannot run on the GPU: this build's Metal backend has no kernels for turbo3"):
        precheck(make_request(model, k="turbo3", v="turbo3", backends=["cpu", "metal"]))
    precheck(make_request(model, k="turbo3", v="turbo3", backends=["cpu", "metal"], n_gpu_layers="0"))
    precheck(make_request(model, k="q8_0", v="q8_0", backends=["cpu", "metal"]))


def _fake_tool(tmp_path: Path, backends: list[str], listing: str, rc: int = 0) -> Path:
    """A build whose tool prints `listing` for --list-devices, as common_print_available_devices does."""
    binary = _fake_build(tmp_path, backends)
    binary.write_text(f"#!/bin/sh\n[ \"$1\" = --list-devices ] || exit 9\ncat <<'X'\n{listing}X\nexit {rc}\n")
    binary.chmod(0o755)
    return binary


def test_device_names_the_listed_gpus(tmp_path):
    from tqgguf.runinfo import cpu_name, device, list_devices

    vk = _fake_tool(tmp_path, ["cpu", "vulkan"],
                    "Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)\n"
                    "  Vulkan1: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 MiB free)\n")
    assert list_devices(vk) == ["llvmpipe (LLVM 15.0.6, 256 bits)", "AMD Radeon RX 7900 XTX (RADV NAVI31)"]
    assert device(vk, None) == "llvmpipe (LLVM 15.0.6, 256 bits), AMD Radeon RX 7900 XTX (RADV NAVI31) (vulkan)"
    assert device(vk, "0") == device(vk, 0) == f"{cpu_name()} ({os.cpu_count()} cores)"   # nothing offloaded


def test_device_of_a_gpu_build_without_a_gpu(tmp_path):
    from tqgguf.runinfo import device, list_devices

    none = _fake_tool(tmp_path, ["cpu", "vulkan"], "Available devices:\n  (none)\n")
    assert list_devices(none) == []
    assert device(none, "99").endswith("cores); the vulkan build found no GPU")


def test_device_when_the_tool_cannot_list(tmp_path, monkeypatch):
    from tqgguf import runinfo

    broken = _fake_tool(tmp_path, ["cpu", "cuda"], "error: unknown argument\n", rc=1)
    assert runinfo.list_devices(broken) is None
    monkeypatch.setattr(runinfo, "gpu_names", lambda: ["NVIDIA H200"])  # then nvidia-smi's names
    assert runinfo.device(broken, None) == "NVIDIA H200 (cuda)"
    monkeypatch.setattr(runinfo, "gpu_names", lambda: [])
    assert runinfo.device(broken, None) == "cuda GPU"


def test_serve_bin_dir_is_held_to_the_backends_it_was_built_for(tmp_path):
    """`tqgguf serve --bin-dir DIR` without -b: the build in DIR says it is a CUDA build, so a pair CUDA has no
    kernel for is refused before llama-server starts (exit 2), as `-b cuda` would; -ngl 0 lets it through to the
    launch (here a stand-in server that exits at once: exit 1, its output named)."""
    import subprocess
    import sys

    from tqgguf.models import smollm2_path

    d = tmp_path / "bin"
    d.mkdir()
    server = d / "llama-server"
    server.write_text("#!/bin/sh\necho 'stand-in server: no model loaded' >&2\nexit 3\n")
    server.chmod(0o755)
    (d / "tqgguf-manifest.json").write_text(json.dumps({"backends": ["cpu", "cuda"]}))
    env = dict(os.environ, TQGGUF_CACHE=str(tmp_path / "cache"), NO_COLOR="1", COLUMNS="200")
    env.pop("TQGGUF_BIN_DIR", None)
    base = [sys.executable, "-m", "tqgguf", "serve", "-m", str(smollm2_path()), "--bin-dir", str(d), "--port", "auto",
            "-ctk", "q4_0", "-ctv", "turbo3"]
    r = subprocess.run(base, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "cannot run on the GPU" in r.stderr and "q4_0" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(base + ["-ngl", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "stand-in server: no model loaded" in r.stderr, r.stderr


def test_a_local_build_is_named_when_the_pinned_one_is_missing(tmp_path, monkeypatch):
    """After `tqgguf build --source DIR` only, a command that looks for the pinned build says where the local
    build is and how to use it, instead of only 'run tqgguf build'."""
    from tqgguf.runinfo import find_tool

    monkeypatch.setenv("TQGGUF_CACHE", str(tmp_path))
    monkeypatch.delenv("TQGGUF_BIN_DIR", raising=False)
    monkeypatch.setattr("tqgguf.source.cached_pinned_source", lambda pin: None)
    for name, backends, when in (("cpu-aaa", ["cpu"], "2026-01-01T00:00:00Z"),
                                 ("cpu-cuda-bbb", ["cpu", "cuda"], "2026-01-02T00:00:00Z"),
                                 ("cpu-cuda-ccc", ["cpu", "cuda"], "2026-01-03T00:00:00Z")):
        b = tmp_path / "build" / name / "bin"
        b.mkdir(parents=True)
        (b / "llama-server").write_text("")
        (b / "tqgguf-manifest.json").write_text(json.dumps({
            "source": {"kind": "local", "root": f"/src/{name}"}, "backends": backends, "built_at": when,
            "build_dir": str(b.parent), "binaries": {"llama-server": str(b / "llama-server")}}))
    with pytest.raises(TqError) as e:
        find_tool("llama-server", backends=["cuda"])
    assert "llama.cpp has not been built yet" in e.value.message and "/src/cpu-cuda-ccc" in e.value.message
    assert e.value.hint == f"use it with --bin-dir {tmp_path / 'build' / 'cpu-cuda-ccc' / 'bin'} (or $TQGGUF_BIN_DIR)"
    with pytest.raises(TqError, match="/src/cpu-aaa"):
        find_tool("llama-server")
    with pytest.raises(TqError) as e:
        find_tool("llama-bench", backends=["cuda"])             # no local build has it
    assert e.value.message == "llama.cpp has not been built yet"
