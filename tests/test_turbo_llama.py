"""turbo2/3/4 inside llama.cpp on the CPU: quality gate on a real model, synthetic shapes, cache size,
context shift and session state. Every figure comes from the patched binaries of the shared CPU build."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tqgguf.perplexity import CacheConfig, run_perplexity

pytestmark = pytest.mark.build

CHUNKS = int(os.environ.get("TQGGUF_PPL_CHUNKS", "6"))  # the issue allows at most 10 in CI
SMOL_CONFIGS = ["q8_0", "q4_0", "turbo4", "turbo3", "turbo2",
                "q8_0/q4_0", "q8_0/turbo4", "q8_0/turbo3", "q8_0/turbo2"]
BPV = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "turbo4": 4.25, "turbo3": 3.25, "turbo2": 2.25}


def _table(results: dict) -> str:
    rows = [f"{'K/V':<13} {'PPL':>9} {'ratio':>7} {'KLD':>9} {'±':>8} {'top%':>6} {'K MiB':>7} {'V MiB':>7}"]
    for name, r in results.items():
        rows.append(f"{name:<13} {r.ppl:9.4f} {r.ppl_ratio or 1:7.4f} {r.kld or 0:9.5f} {r.kld_err or 0:8.5f} "
                    f"{r.same_top or 100:6.2f} {r.kv_k_mib or 0:7.2f} {r.kv_v_mib or 0:7.2f}")
    return "\n".join(rows)


@pytest.fixture(scope="module")
def smol_results(llama_bin, text_file, tmp_path_factory):
    from tqgguf.models import smollm2_path

    ppl = llama_bin("llama-perplexity")
    model = smollm2_path()
    base = tmp_path_factory.mktemp("kld") / "smollm2-f16.kld"
    res = {"f16": run_perplexity(ppl, model, text_file, CacheConfig.parse("f16"), ctx=512, chunks=CHUNKS,
                                 threads=2, save_base=base)}
    for cfg in SMOL_CONFIGS:
        res[cfg] = run_perplexity(ppl, model, text_file, CacheConfig.parse(cfg), ctx=512, chunks=CHUNKS,
                                  threads=2, kld_base=base)
    print("\n" + _table(res))
    out = os.environ.get("TQGGUF_RESULTS_DIR")
    if out:
        Path(out, "smollm2-kld.txt").write_text(_table(res) + "\n")
    return res


def test_every_turbo_config_is_finite(smol_results):
    for name, r in smol_results.items():
        assert math.isfinite(r.ppl) and r.ppl < 1000, (name, r.ppl)
        if name != "f16":
            assert r.kld is not None and math.isfinite(r.kld), name


def test_kld_ordered_turbo4_turbo3_turbo2(smol_results):
    r = smol_results
    table = _table(r)
    assert r["turbo4"].kld < r["turbo3"].kld < r["turbo2"].kld, table
    assert r["q8_0/turbo4"].kld < r["q8_0/turbo3"].kld < r["q8_0/turbo2"].kld, table


def test_quality_bars_against_rotated_q4_0(smol_results):
    r = smol_results
    table = _table(r)
    assert r["turbo4"].kld <= 1.5 * r["q4_0"].kld, table
    assert r["q8_0/turbo4"].kld <= 1.5 * r["q8_0/q4_0"].kld, table
    assert r["q8_0/turbo3"].kld <= 4.0 * r["q8_0/q4_0"].kld, table


def test_kv_cache_size_is_bits_per_value_times_elements(smol_results):
    """No hidden padding: each cache's MiB is f16's MiB scaled by bits per value / 16."""
    f16 = smol_results["f16"]
    assert f16.kv_k_mib and f16.kv_v_mib, "the KV cache size line was not logged"
    for name, r in smol_results.items():
        c = CacheConfig.parse(name)
        assert r.kv_k_mib == pytest.approx(f16.kv_k_mib * BPV[c.k] / 16, abs=0.011), name
        assert r.kv_v_mib == pytest.approx(f16.kv_v_mib * BPV[c.v] / 16, abs=0.011), name


SYNTH = ["tiny-hd128", "tiny-gqa8", "tiny-swa"]


@pytest.mark.parametrize("preset", SYNTH)
def test_synthetic_shapes_run_every_turbo_config(preset, llama_bin, llama_source, text_file, tmp_path):
    """head_dim 128, head_dim 256 with GQA 8:1, and sliding-window layers: every turbo config runs, with a
    finite KLD against the f16 cache that is ordered turbo4 < turbo3 < turbo2."""
    from tqgguf.synth import PRESETS, find_vocab, synth

    model = tmp_path / f"{preset}.gguf"
    synth(model, PRESETS[preset], find_vocab(llama_source), weights="q8_0", seed=3)
    ppl = llama_bin("llama-perplexity")
    base = tmp_path / "base.kld"
    run_perplexity(ppl, model, text_file, CacheConfig.parse("f16"), ctx=256, chunks=3, threads=2, save_base=base)
    kld = {}
    for cfg in ["turbo4", "turbo3", "turbo2", "f16/turbo3", "turbo3/f16", "q8_0/turbo2", "turbo4/q8_0"]:
        r = run_perplexity(ppl, model, text_file, CacheConfig.parse(cfg), ctx=256, chunks=3, threads=2,
                           kld_base=base)
        assert r.kld is not None and math.isfinite(r.kld) and math.isfinite(r.ppl), (preset, cfg, r.log[-500:])
        kld[cfg] = r.kld
    assert kld["turbo4"] < kld["turbo3"] < kld["turbo2"], (preset, kld)


def _script(bindings, mode, tk, tv, text_file, out):
    from tqgguf.models import smollm2_path

    env = dict(os.environ, PYTHONPATH=str(bindings))
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "_kv_script.py"), mode, str(smollm2_path()),
                        str(text_file), tk, tv, str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return np.load(out)


@pytest.mark.parametrize("which", ["eval", "generated"])
def test_context_shift_with_turbo4(which, bindings, text_file, tmp_path):
    """Past the context size with a K-shift: finite logits, and >= 80% teacher-forced top-token agreement with
    an f16 cache over the 64 tokens after the shift; on WikiText and on the text made for clones without it."""
    if which == "generated":
        from tqgguf.textdata import generated_text

        text_file = tmp_path / "generated.txt"
        text_file.write_text(generated_text())
    ref = _script(bindings, "shift", "f16", "f16", text_file, tmp_path / "f16.npy")
    got = _script(bindings, "shift", "turbo4", "turbo4", text_file, tmp_path / "t4.npy")
    assert np.isfinite(got).all() and np.isfinite(ref).all()
    agree = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    assert agree >= 0.80, agree


@pytest.mark.parametrize("tk,tv", [("turbo3", "turbo3"), ("q8_0", "turbo2")])
def test_state_save_load_gives_identical_logits(bindings, text_file, tmp_path, tk, tv):
    a, b = _script(bindings, "state", tk, tv, text_file, tmp_path / "st.npy")
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)


def test_flash_attention_off_is_a_clear_error(llama_bin, text_file):
    from tqgguf.models import smollm2_path

    r = subprocess.run([str(llama_bin("llama-perplexity")), "-m", str(smollm2_path()), "-f", str(text_file),
                        "-c", "128", "--chunks", "1", "-t", "2", "-fa", "off", "-ctk", "turbo3", "-ctv", "turbo3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode > 0, r.returncode  # an error exit, not a signal (abort)
    assert "require flash attention" in r.stdout + r.stderr


@pytest.mark.parametrize("head_dim,fallback", [(96, "q8_0"), (80, "f16")])
def test_head_dims_not_multiple_of_64_fall_back(head_dim, fallback, llama_bin, llama_source, text_file, tmp_path):
    from tqgguf.synth import SynthShape, find_vocab, synth

    model = tmp_path / "odd.gguf"
    synth(model, SynthShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=head_dim, n_ff=512,
                            n_ctx_train=4096), find_vocab(llama_source), weights="q8_0")
    r = run_perplexity(llama_bin("llama-perplexity"), model, text_file, CacheConfig.parse("turbo3"), ctx=128,
                       chunks=1, threads=2)
    assert math.isfinite(r.ppl)
    warnings = [ln for ln in r.log.splitlines() if "needs one head dim that is a multiple of 64" in ln]
    assert len(warnings) == 2 and all(f"using {fallback} instead" in w for w in warnings), warnings


ALL_TYPES = ["f16", "q8_0", "q4_0", "turbo2", "turbo3", "turbo4"]


def test_every_k_v_pair_runs(llama_bin, llama_source, text_file, tmp_path):
    """All 36 K/V pairs among f16, q8_0, q4_0 and the turbo types run and give finite perplexities."""
    from tqgguf.synth import PRESETS, find_vocab, synth

    model = tmp_path / "hd64.gguf"
    synth(model, PRESETS["tiny-hd64"], find_vocab(llama_source), weights="q8_0", seed=5)
    ppl = llama_bin("llama-perplexity")
    bad = {}
    for k in ALL_TYPES:
        for v in ALL_TYPES:
            r = run_perplexity(ppl, model, text_file, CacheConfig(k, v), ctx=128, chunks=1, threads=2)
            if not math.isfinite(r.ppl):
                bad[f"{k}/{v}"] = r.ppl
    assert not bad, bad


def test_rotations_sit_next_to_their_consumers(llama_bin, llama_source, text_file, tmp_path, monkeypatch):
    """The GPU backends fuse a turbo rotation (MUL -> Hadamard MUL_MAT -> MUL) with the op that consumes it only when
    nothing but views lies between them (patches 0014 and 0015). In the graph llama.cpp builds, K's and V's rotations
    come right before their SET_ROWS, Q's right before the attention and the output's right after it: checked on the
    scheduler's node list (GGML_SCHED_DEBUG=2 prints every node that is not a view)."""
    import re

    from tqgguf.synth import PRESETS, find_vocab, synth

    model = tmp_path / "hd128.gguf"
    synth(model, PRESETS["tiny-hd128"], find_vocab(llama_source), weights="q8_0", seed=7)
    monkeypatch.setenv("GGML_SCHED_DEBUG", "2")
    r = run_perplexity(llama_bin("llama-perplexity"), model, text_file, CacheConfig.parse("turbo3"), ctx=128,
                       chunks=1, threads=2, extra=["-b", "128", "-v"], timeout=300)
    ops = [m.group(1) for m in re.finditer(r"node #\s*\d+ \(\s*([A-Z_]+)\)", r.log)]
    rot = ["MUL", "MUL_MAT", "MUL"]
    attn = [k for k, op in enumerate(ops) if op == "FLASH_ATTN"]
    stores = [k for k, op in enumerate(ops) if op == "SET_ROWS"]
    n_layer = PRESETS["tiny-hd128"].n_layer
    assert len(attn) >= n_layer and len(stores) == 2*len(attn), (len(attn), len(stores))
    assert all(ops[k - 3:k] == rot for k in stores), [ops[k - 3:k + 1] for k in stores if ops[k - 3:k] != rot][:3]
    assert all(ops[k - 3:k] == rot and ops[k + 1:k + 4] == rot for k in attn), \
        [ops[k - 3:k + 4] for k in attn if ops[k - 3:k] != rot or ops[k + 1:k + 4] != rot][:3]
