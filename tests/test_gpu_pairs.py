"""K/V pairs a CUDA/HIP build has no flash-attention kernel for are refused before anything runs.

Patch 0011 gives every pair of a turbo type with f16, q8_0 or a turbo type a CUDA/HIP kernel; any other partner
(q4_0, bf16, ...) would make llama.cpp run that attention on the CPU and copy the cache every token."""

from __future__ import annotations

import json
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
    err = kvcompat.gpu_pair_error(k, v)
    assert (err is None) == ok
    if not ok:
        assert f"K {k} / V {v}" in err and "CPU" in err


def test_gpu_offload():
    assert kvcompat.gpu_offload(["cpu", "cuda"], None)
    assert kvcompat.gpu_offload(["cpu", "hip"], "99")
    assert not kvcompat.gpu_offload(["cpu", "cuda"], "0")
    assert not kvcompat.gpu_offload(["cpu", "cuda"], 0)
    assert not kvcompat.gpu_offload(["cpu"], "99")
    assert not kvcompat.gpu_offload(["cpu", "vulkan"], None)  # the Vulkan backend has no turbo kernels to check


def _fake_build(tmp_path: Path, backends: list[str]) -> Path:
    binary = tmp_path / "llama-perplexity"
    binary.write_text("")
    (tmp_path / "tqgguf-manifest.json").write_text(json.dumps({"backends": backends}))
    return binary


def test_check_gpu_pairs(tmp_path):
    cfgs = [CacheConfig.parse("turbo4/turbo3"), CacheConfig.parse("q4_0/turbo3")]
    cuda = _fake_build(tmp_path, ["cpu", "cuda"])
    with pytest.raises(TqError, match="config q4_0/turbo3: K q4_0 / V turbo3 has no CUDA/HIP"):
        check_gpu_pairs(cuda, None, cfgs)
    check_gpu_pairs(cuda, "0", cfgs)          # everything on the CPU: fine
    check_gpu_pairs(cuda, None, cfgs[:1])     # a pair with a kernel: fine
    # the boundary-layer V type pairs with K too
    with pytest.raises(TqError, match="V q4_0"):
        check_gpu_pairs(cuda, None, [CacheConfig.parse("turbo4/turbo2+bv2:q4_0")])
    cpu_dir = tmp_path / "cpu"
    cpu_dir.mkdir()
    check_gpu_pairs(_fake_build(cpu_dir, ["cpu"]), None, cfgs)


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
