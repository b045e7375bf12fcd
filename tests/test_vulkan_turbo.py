"""The Vulkan backend's turbo kernels (patches 0040, 0042, 0044-0051) against the CPU backend, on lavapipe.

test-backend-ops compares a backend with the CPU backend; lavapipe is a Vulkan driver that runs on the CPU, so a
machine without a GPU checks the real Vulkan shaders (the turbo quantizer of SET_ROWS, the dequantizers of GET_ROWS
and CPY, and flash attention's turbo decoding). ggml lists lavapipe only when GGML_VK_VISIBLE_DEVICES names it.

The module needs what a Vulkan build needs (Vulkan headers and loader, glslc, SPIR-V headers) and lavapipe's ICD;
`.ci/run` installs them on Debian. Elsewhere it is skipped, with the missing pieces named.
The Vulkan build takes about 7 minutes on 2 cores, and lavapipe compiles each flash-attention pipeline with LLVM,
20-70 s per K/V pair and head size on 2 cores (about 70 s on an Intel Xeon CI-sized machine, where all 21 pairs at
head size 128 did not finish in 25 minutes), so the flash-attention cases here are a subset: each turbo type as K
and V together, q8_0 K with a turbo V and a turbo K with an f16 V, at head size 128, GQA 4 and one query; head size
64 for turbo3. bench/results/vulkan-lavapipe-turbo-kernels/ has the wider runs (all 21 pairs, head sizes 64 and 256
for every turbo type, 72 cases). One SmolLM2 run with four KV streams checks that a whole model's cache writes run
as 0045's fused dispatch, K's with its RoPE in it (0048).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

from tqgguf.build import BuildSpec, run_build
from tqgguf.doctor import run_doctor

LAVAPIPE_ICDS = ("/usr/share/vulkan/icd.d/lvp_icd.*.json", "/etc/vulkan/icd.d/lvp_icd.*.json")


def _missing() -> list[str]:
    vk = run_doctor().backend("vulkan")
    missing = list(vk.reasons) if vk and not vk.buildable else []
    if not any(glob.glob(p) for p in LAVAPIPE_ICDS):
        missing.append("Mesa's lavapipe ICD (apt-get install mesa-vulkan-drivers)")
    return missing


_MISSING = _missing()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason="no Vulkan toolchain or lavapipe: " + "; ".join(_MISSING))


@pytest.fixture(scope="module")
def vk_bin(pin, pinned):
    """The Vulkan build's bin folder, with test-backend-ops and llama-perplexity."""
    spec = BuildSpec(backends=["vulkan"], targets=["test-backend-ops", "llama-perplexity"])
    return run_build(pinned, pin, spec, jobs=os.cpu_count()).bin_dir


@pytest.fixture(scope="module")
def backend_ops(vk_bin):
    path = vk_bin / "test-backend-ops"
    assert path.is_file()
    return path


def run_ops(binary, op: str, params: str, timeout: int = 900, extra_env: dict | None = None) -> tuple[int, int, str]:
    """(passed, run) of test-backend-ops on lavapipe for one op and params regex, and its output."""
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0", **(extra_env or {})}
    r = subprocess.run([str(binary), "test", "-b", "Vulkan0", "-o", op, "-p", params], capture_output=True,
                       text=True, timeout=timeout, env=env)
    out = r.stdout + r.stderr
    assert "Vulkan0" in out, f"lavapipe was not listed as Vulkan0:\n{out[-3000:]}"
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert m, f"no test summary (rc {r.returncode}):\n{out[-3000:]}"
    assert "FAIL" not in out, "\n".join(line for line in out.splitlines() if "FAIL" in line)
    assert r.returncode == 0, out[-3000:]
    return int(m.group(1)), int(m.group(2)), out


# CPY cases that Vulkan does not claim, as for its other quantized types: f16 <-> turbo (Vulkan converts quantized
# types to and from f32 only) and same-type copies of a permuted (non-contiguous) source
CPY_UNCLAIMED = re.compile(r"CPY\(type_src=(f16,type_dst=turbo\d|turbo\d,type_dst=f16|(turbo\d),type_dst=\2,"
                           r"ne_src=\[\d+,\d+,\d+,\d+\],permute_src=\[0,2,1,3\])")


@pytest.mark.parametrize("op,count,unclaimed", [
    ("SET_ROWS", 90, 0),   # f32 and f16 rows, cache-shaped writes for head sizes 64/128/256, i32 and i64 indices
    ("GET_ROWS", 30, 0),
    ("CPY", 27, 27),       # f32 <-> turbo and contiguous same-type copies
])
def test_cache_ops(backend_ops, op, count, unclaimed):
    passed, run, out = run_ops(backend_ops, op, "turbo")
    assert (passed, run) == (count, count)
    unsupported = [line for line in out.splitlines() if "not supported" in line]
    assert len(unsupported) == unclaimed
    assert all(CPY_UNCLAIMED.search(line) for line in unsupported), unsupported


def test_rotation_chain(backend_ops):
    """The turbo cache write as llama.cpp builds it: MUL by the signs, the Hadamard MUL_MAT, MUL by the signs, then
    SET_ROWS (turbo2/3/4 at head sizes 64/128/256, and q8_0's rotation without signs). Patch 0045 runs a turbo
    cache's whole chain as one dispatch (the rotation of 0042's signed fwht in front of the SET_ROWS); a q8_0 cache
    keeps upstream's fwht; GGML_VK_DISABLE_FUSION=1 runs them one by one, and all must match the CPU.

    The turbo cases and q8_0's run in two processes: Mesa 22.3's lavapipe (Debian 12) frees a buffer's resource
    twice on its queue thread after a turbo case and two q8_0 cases in one process, and the process dies of heap
    corruption; Mesa 25.0 runs the same binary clean (bench/results/vulkan-lavapipe-kv-suite/)."""
    passed, run, _ = run_ops(backend_ops, "TURBO_ROT_SET_ROWS", "type=turbo")
    assert (passed, run) == (27, 27)
    passed, run, _ = run_ops(backend_ops, "TURBO_ROT_SET_ROWS", "type=q8_0")
    assert (passed, run) == (9, 9)
    # ggml-vulkan's perf logger names each dispatch, a fused one by its fusion
    one = r"type=turbo3,d=128,n_head=2,n_tokens=7,"
    _, _, fused = run_ops(backend_ops, "TURBO_ROT_SET_ROWS", one, extra_env={"GGML_VK_PERF_LOGGER": "1"})
    assert re.search(r"^TURBO_ROT_SET_ROWS MUL: 1 x", fused, re.M), fused[-2000:]
    assert not re.search(r"^(MUL_MAT|MUL_FWHT_MUL|SET_ROWS)", fused, re.M), fused[-2000:]
    passed, run, plain = run_ops(backend_ops, "TURBO_ROT_SET_ROWS", "type=turbo3",
                                 extra_env={"GGML_VK_PERF_LOGGER": "1", "GGML_VK_DISABLE_FUSION": "1"})
    assert (passed, run) == (9, 9)
    assert "MUL_FWHT_MUL" not in plain and re.search(r"^MUL_MAT", plain, re.M), plain[-2000:]
    # Q's and the output's rotations around the attention have no SET_ROWS behind them: 0049 runs them inside the
    # attention (TURBO_ROT_FATTN), with no fwht or MUL_MAT dispatch left
    one = r"type_K=turbo3,type_V=turbo3,d=64,n_head=8,n_head_kv=2,n_tokens=1,n_kv=64,"
    passed, run, attn = run_ops(backend_ops, "TURBO_ROT_FATTN", one, extra_env={"GGML_VK_PERF_LOGGER": "1"})
    assert (passed, run) == (1, 1)
    assert re.search(r"^TURBO_ROT_FATTN MUL: 1 x", attn, re.M), attn[-2000:]
    assert not re.search(r"^(MUL_FWHT_MUL|MUL_MAT)", attn, re.M), attn[-2000:]


# K's and V's writes of one layer with K's RoPE in front (test_turbo_rot_set_rows_kv): norm and neox modes, head
# sizes 64/128/256, a partial RoPE with frequency factors, one and five tokens
ROPE_KV_CASES = [
    "type=turbo3,d=128,n_head=8,n_tokens=1,n_kv=16,rope_mode=0,n_dims=128,ff=0",
    "type=turbo2,d=64,n_head=2,n_tokens=5,n_kv=32,rope_mode=2,n_dims=64,ff=0",
    "type=turbo4,d=256,n_head=8,n_tokens=1,n_kv=16,rope_mode=0,n_dims=256,ff=0",
    "type=turbo3,d=128,n_head=8,n_tokens=1,n_kv=16,rope_mode=2,n_dims=64,ff=1",
]


@pytest.mark.parametrize("params", ROPE_KV_CASES)
def test_rope_in_the_cache_write(backend_ops, params):
    """Patch 0048 runs K's RoPE, the rotation and the SET_ROWS into a turbo cache as one dispatch, with the RoPE's
    own functions: the cache must match the CPU's unfused RoPE and rotation, and the perf logger must show K's write
    as ROPE_TURBO_ROT_SET_ROWS and V's as TURBO_ROT_SET_ROWS, with no RoPE, rotation or SET_ROWS left over.

    One case per process: Mesa 22.3's lavapipe dies of heap corruption in longer runs of these graphs, fused or not
    (GGML_VK_DISABLE_FUSION=1), as described under test_rotation_chain; one at a time they pass on it."""
    passed, run, out = run_ops(backend_ops, "TURBO_ROT_SET_ROWS_KV", "^" + params + "$",
                               extra_env={"GGML_VK_PERF_LOGGER": "1"})
    assert (passed, run) == (1, 1)
    assert re.search(r"^ROPE_TURBO_ROT_SET_ROWS ROPE: 1 x", out, re.M), out[-2000:]
    assert re.search(r"^TURBO_ROT_SET_ROWS MUL: 1 x", out, re.M), out[-2000:]
    assert not re.search(r"^(ROPE|MUL_MAT|MUL_FWHT_MUL|SET_ROWS|MUL):", out, re.M), out[-2000:]


@pytest.mark.parametrize("params,count", [
    # 5 K/V pairs: turbo2/turbo2, turbo3/turbo3, turbo4/turbo4, q8_0/turbo3 and turbo4/f16
    pytest.param(r"hsk=128,hsv=128,nh=2,nr23=\[4,1\],kv=512,nb=1,.*type_K=(turbo2,type_V=turbo2|turbo3,type_V=turbo3|"
                 r"turbo4,type_V=turbo4|q8_0,type_V=turbo3|turbo4,type_V=f16),", 5, id="pairs-hs128"),
    # turbo3/turbo3 at head size 64, 8 queries (head size 256 took lavapipe 6 minutes on that machine: in the results)
    pytest.param(r"hsk=64,hsv=64,nh=2,nr23=\[1,1\],kv=512,nb=8,.*type_K=turbo3,type_V=turbo3,", 1, id="turbo3-hs64"),
])
def test_flash_attn(backend_ops, params, count):
    passed, run, _ = run_ops(backend_ops, "FLASH_ATTN_EXT", params, timeout=1200)
    assert (passed, run) == (count, count)


def test_flash_attn_staged(backend_ops):
    """Rows staged through shared memory, as ggml-vulkan does on NVIDIA GPUs (patch 0047 decodes a turbo side there
    sixteen values per invocation); GGML_VK_FA_SHMEM_STAGING=1 takes that path on lavapipe. Each turbo type as K,
    turbo2 and turbo3 as V. (A build whose staged decoder scaled one value in four by 0.5 failed here and passed
    without the switch: bench/results/vulkan-lavapipe-0047/.)"""
    params = (r"hsk=128,hsv=128,nh=2,nr23=\[4,1\],kv=512,nb=1,.*type_K=(turbo2,type_V=turbo2|turbo3,type_V=turbo3|"
              r"turbo4,type_V=f16),")
    passed, run, _ = run_ops(backend_ops, "FLASH_ATTN_EXT", params, timeout=1200,
                             extra_env={"GGML_VK_FA_SHMEM_STAGING": "1"})
    assert (passed, run) == (3, 3)


def test_rotations_in_flash_attn(backend_ops):
    """Patch 0049: Q's turbo rotation, the attention and the output's rotation as one fused group (TURBO_ROT_FATTN),
    both rotations inside the scalar shader: a cache of 64 rows in one part (the output rotated by the attention
    shader itself) and one of 1024 rows split over workgroups (rotated by the merge, fa_split_k_reduce_rot). The two
    cases share one pipeline, which lavapipe compiles in about 2 minutes on 2 cores. The perf logger must show the
    fused group alone, with no rotation dispatch left over."""
    params = r"^type_K=turbo3,type_V=turbo3,d=128,n_head=8,n_head_kv=2,n_tokens=1,n_kv=(64|1024),rot_v=128$"
    passed, run, out = run_ops(backend_ops, "TURBO_ROT_FATTN", params, timeout=1200,
                               extra_env={"GGML_VK_PERF_LOGGER": "1"})
    assert (passed, run) == (2, 2)
    assert len(re.findall(r"^TURBO_ROT_FATTN MUL: 1 x", out, re.M)) == 2, out[-3000:]
    assert not re.search(r"^(MUL_FWHT_MUL|FLASH_ATTN_EXT|MUL_MAT|MUL)\b", out, re.M), out[-3000:]


@pytest.mark.parametrize("setting", [{}, {"GGML_VK_DISABLE_TURBO_DEQUANT_KV": "1"}], ids=["f16-scratch", "scalar"])
def test_prefill_in_the_cache_layout(backend_ops, setting):
    """Patch 0050's cases: attention over turbo caches in llama.cpp's own layout (a token's heads side by side) at
    prompt sizes, 64 queries (whole blocks of rows) and 100 (a partial one), with Q's and the output's rotations.
    The other Vulkan cases here have at most 8 queries over contiguous caches. Both prompt paths: patch 0051's
    (the cache expanded to an f16 scratch by dequant_turbo_transpose.comp, then the f16 shader) and, with
    GGML_VK_DISABLE_TURBO_DEQUANT_KV, the scalar shader on the turbo codes. One process per run: Mesa 22.3's
    lavapipe dies in its heap in longer runs (see test_rotation_chain)."""
    params = r"^type_K=turbo3,type_V=turbo3,d=64,n_head=8,n_head_kv=2,n_tokens=(64|100),n_kv=512,rot_v=64,cache_layout=1$"
    passed, run, _ = run_ops(backend_ops, "TURBO_ROT_FATTN", params, timeout=1200, extra_env=setting)
    assert (passed, run) == (2, 2)


def test_cache_writes_fused_in_a_model(vk_bin, text_file):
    """SmolLM2 on lavapipe with 4 sequences per batch: 4 KV streams, so llama.cpp reshapes each cache right before
    its SET_ROWS, and ggml_vk_graph_optimize reorders a whole model's graph. Every K and V write of the 30 layers
    must still run as one dispatch, K's with its RoPE (0048's ROPE_TURBO_ROT_SET_ROWS), V's as 0045's
    TURBO_ROT_SET_ROWS (0045's first form fused none of them here, while test-backend-ops' small graphs fused), and
    the run must give a sane perplexity. (With GGML_VK_DISABLE_FUSION=1 the same run gave the same PPL, 42.0169.)
    The attention runs with its rotations as one group (0049's TURBO_ROT_FATTN) in every layer; in the last one Q's
    rotation runs on its own, as llama.cpp puts the GET_ROWS of the output rows between it and the attention."""
    from tqgguf.models import smollm2_path

    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0", GGML_VK_PERF_LOGGER="1")
    cmd = [str(vk_bin / "llama-perplexity"), "-m", str(smollm2_path()), "-f", str(text_file), "-c", "128", "-b", "512",
           "--chunks", "4", "-t", str(os.cpu_count() or 2), "-fa", "on", "-ctk", "turbo3", "-ctv", "turbo3",
           "-ngl", "99"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "n_seq=4" in out, out[-3000:]
    # the logger prints a table per interval; each interval here is whole graphs of 30 layers
    k_writes = [int(n) for n in re.findall(r"^ROPE_TURBO_ROT_SET_ROWS ROPE: (\d+) x", out, re.M)]
    v_writes = [int(n) for n in re.findall(r"^TURBO_ROT_SET_ROWS MUL: (\d+) x", out, re.M)]
    assert k_writes and all(n == 30 for n in k_writes), (k_writes, out[-3000:])
    assert v_writes and all(n == 30 for n in v_writes), (v_writes, out[-3000:])
    assert not re.search(r"^SET_ROWS", out, re.M), out[-3000:]
    for table in out.split("Vulkan Timings:")[1:]:
        groups = sum(int(n) for n in re.findall(r"^TURBO_ROT_FATTN \w+\b.*?: (\d+) x", table, re.M))
        alone = sum(int(n) for n in re.findall(r"^MUL_FWHT_MUL MUL: (\d+) x", table, re.M))
        assert groups == 30 and alone <= 1, (groups, alone, table[-2000:])
    m = re.search(r"Final estimate: PPL = ([\d.]+)", out)
    assert m and 1.0 < float(m.group(1)) < 200.0, out[-3000:]

