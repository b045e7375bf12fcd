"""The boundary-layer V policy inside llama.cpp (patch "llama: boundary-layer V cache types"), through the patched
llama-perplexity and llama-bench: which layers it picks, that it never lowers precision, that two contexts in one
process can differ, and that it lowers turbo2's KL divergence on a real model."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from tqgguf.perplexity import CacheConfig, run_perplexity
from tqgguf.serve import parse_server_log, parse_v_types

pytestmark = pytest.mark.build

QUALITY_CHUNKS = 10  # the issue: SmolLM2, WikiText, 10 chunks


def _boundary(n: int, t: str = "q8_0") -> list[str]:
    return ["--cache-boundary-layers", str(n), "--cache-type-v-boundary", t]


def _v_types(log: str) -> dict[int, str]:
    """Per-layer V types from every `llama_kv_cache: V types:` line (one per cache)."""
    out: dict[int, str] = {}
    lines = re.findall(r"llama_kv_cache: V types: (.+)", log)
    assert lines, "llama.cpp logged no per-layer V types"
    for ln in lines:
        got = parse_v_types(ln)
        assert not set(got) & set(out), f"a layer is in two caches: {lines}"
        out.update(got)
    return out


@pytest.fixture(scope="module")
def smol():
    from tqgguf.models import smollm2_path

    return smollm2_path()


@pytest.fixture(scope="module")
def swa_model(llama_source, tmp_path_factory) -> Path:
    """6 layers, sliding window, every 3rd layer full: full layers 2 and 5, SWA layers 0, 1, 3, 4."""
    from tqgguf.synth import PRESETS, find_vocab, swa_layers, synth

    shape = PRESETS["tiny-swa"]
    assert swa_layers(shape) == [True, True, False, True, True, False]
    path = tmp_path_factory.mktemp("swa") / "tiny-swa.gguf"
    synth(path, shape, find_vocab(llama_source), weights="q8_0", seed=7)
    return path


@pytest.mark.parametrize("n,expected", [(1, [0, 5]), (2, [0, 1, 4, 5])])
def test_boundary_layers_are_counted_over_the_whole_model(n, expected, swa_model, llama_bin, text_file):
    """N counts KV-bearing layers from each end of the whole model, not of each cache: with N=1 a per-cache count
    would pick 2, 5 (full cache) and 0, 4 (SWA cache)."""
    r = run_perplexity(llama_bin("llama-perplexity"), swa_model, text_file, CacheConfig("turbo4", "turbo2"), ctx=256,
                       chunks=1, threads=2, extra=_boundary(n))
    eff = parse_server_log(r.log)
    assert eff.boundary_layers == expected, r.log[-3000:]
    assert eff.v == "turbo2"          # the layers between the boundaries, even where the boundary has more layers
    v = _v_types(r.log)
    assert sorted(v) == list(range(6)), v
    assert {il for il, t in v.items() if t == "q8_0"} == set(expected), v
    assert {il for il, t in v.items() if t == "turbo2"} == set(range(6)) - set(expected), v
    # two caches (full + sliding window), each logging its own mixed types, and still parseable size lines
    assert len(eff.caches) == 2 and r.kv_v_mib is not None, r.log[-3000:]
    assert math.isfinite(r.ppl)


def test_explicit_layer_list_equals_the_boundary_policy(smol, llama_bin, text_file):
    """--cache-type-v-layers 0-1,28-29:q8_0 is the same cache as --cache-boundary-layers 2 on SmolLM2 (30 layers)."""
    ppl = llama_bin("llama-perplexity")
    cfg = CacheConfig("turbo4", "turbo2")
    a = run_perplexity(ppl, smol, text_file, cfg, ctx=256, chunks=2, threads=2, extra=_boundary(2))
    b = run_perplexity(ppl, smol, text_file, cfg, ctx=256, chunks=2, threads=2,
                       extra=["--cache-type-v-layers", "0-1,28-29:q8_0"])
    assert _v_types(a.log) == _v_types(b.log)
    assert _v_types(a.log) == {il: ("q8_0" if il in (0, 1, 28, 29) else "turbo2") for il in range(30)}
    assert a.ppl == b.ppl and a.kv_mib == b.kv_mib
    assert "(mixed V types)" in a.log


@pytest.mark.parametrize("v", ["f16", "q8_0"])
def test_policy_never_lowers_precision(v, smol, llama_bin, text_file, tmp_path):
    """With V at f16 or q8_0, a q8_0 boundary changes nothing: every layer keeps V's type, and the logits (hence
    the greedy output) are bit-identical to a run without the policy: the same perplexity and the same KL divergence
    statistics against an f16 reference, to the last printed digit."""
    ppl = llama_bin("llama-perplexity")
    base = tmp_path / "base.kld"
    run_perplexity(ppl, smol, text_file, CacheConfig.parse("f16"), ctx=256, chunks=2, threads=2, save_base=base)
    cfg = CacheConfig("q8_0", v)
    ref = run_perplexity(ppl, smol, text_file, cfg, ctx=256, chunks=2, threads=2, kld_base=base)
    got = run_perplexity(ppl, smol, text_file, cfg, ctx=256, chunks=2, threads=2, kld_base=base,
                         extra=_boundary(4) + ["--cache-type-v-layers", "5-9:q8_0"])
    assert set(_v_types(got.log).values()) == {v}
    assert eff_stats(got) == eff_stats(ref)
    assert got.kv_mib == ref.kv_mib
    if v == "f16":
        assert "do not raise precision over f16" in got.log


def eff_stats(r) -> tuple:
    return (r.ppl, r.ppl_err, r.kld, r.kld_err, r.kld_p99, r.same_top, r.ppl_ratio)


def test_two_contexts_in_one_process_use_different_policies(smol, llama_bin):
    """llama-bench creates one context per test in the same process: boundary 0 and 2 side by side."""
    r = subprocess.run([str(llama_bin("llama-bench")), "-m", str(smol), "-ctk", "turbo4", "-ctv", "turbo2", "-fa", "1",
                        "-p", "16", "-n", "0", "-r", "1", "-t", "2", "--no-warmup", "-v", "-o", "jsonl",
                        "--cache-boundary-layers", "0,2,0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    types = [parse_v_types(x) for x in re.findall(r"llama_kv_cache: V types: (.+)", r.stderr)]
    assert len(types) == 3, r.stderr[-3000:]
    assert set(types[0].values()) == {"turbo2"} and set(types[2].values()) == {"turbo2"}
    assert {il for il, t in types[1].items() if t == "q8_0"} == {0, 1, 28, 29}
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [int(re.search(r'"n_v_boundary": (\d+)', ln).group(1)) for ln in rows] == [0, 2, 0]


@pytest.fixture(scope="module")
def quality(smol, llama_bin, text_file, tmp_path_factory):
    ppl = llama_bin("llama-perplexity")
    base = tmp_path_factory.mktemp("kld") / "smol-f16.kld"
    run_perplexity(ppl, smol, text_file, CacheConfig.parse("f16"), ctx=512, chunks=QUALITY_CHUNKS, threads=2,
                   save_base=base)
    cfg = CacheConfig("turbo4", "turbo2")
    res = {
        "off": run_perplexity(ppl, smol, text_file, cfg, ctx=512, chunks=QUALITY_CHUNKS, threads=2, kld_base=base),
        "boundary 2 q8_0": run_perplexity(ppl, smol, text_file, cfg, ctx=512, chunks=QUALITY_CHUNKS, threads=2,
                                          kld_base=base, extra=_boundary(2)),
    }
    lines = [f"{name:<16} KLD {r.kld:.5f} ± {r.kld_err:.5f}  PPL ratio {r.ppl_ratio:.4f}  same top {r.same_top:.2f}%  "
             f"KV {r.kv_mib:.2f} MiB" for name, r in res.items()]
    off, on = res["off"].kld, res["boundary 2 q8_0"].kld
    lines.append(f"boundary policy lowers KLD by {100 * (off - on) / off:.1f}% ({off:.5f} -> {on:.5f})")
    print("\n" + "\n".join(lines))
    out = os.environ.get("TQGGUF_RESULTS_DIR")
    if out:
        Path(out, "smollm2-boundary-kld.txt").write_text("\n".join(lines) + "\n")
    return res


def test_boundary_policy_lowers_turbo2_kld(quality):
    off, on = quality["off"], quality["boundary 2 q8_0"]
    assert on.kld < off.kld, (on.kld, off.kld)
    # more than noise: the difference is larger than the standard error of the smaller estimate
    assert off.kld - on.kld > min(off.kld_err, on.kld_err), (off.kld, off.kld_err, on.kld, on.kld_err)
    # the price: 4 of 30 layers' V at q8_0 instead of turbo2
    assert on.kv_v_mib > off.kv_v_mib and on.kv_k_mib == off.kv_k_mib
