"""Parsing llama-perplexity output (a recorded real KL-divergence run of SmolLM2 at the pinned upstream)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tqgguf.errors import TqError
from tqgguf.perplexity import CacheConfig, parse_output

DATA = Path(__file__).parent / "data"


def test_parse_recorded_kld_run():
    r = parse_output("q8_0/q4_0", (DATA / "perplexity-kld.log").read_text())
    assert r.ppl == pytest.approx(23.599301) and r.ppl_err == pytest.approx(2.356971)
    assert r.kld == pytest.approx(0.010266) and r.kld_err == pytest.approx(0.000504)
    assert r.kld_p99 == pytest.approx(0.077371)
    assert r.same_top == pytest.approx(93.824) and r.same_top_err == pytest.approx(0.754)
    assert r.ppl_ratio == pytest.approx(1.012537)


def test_parse_ppl_run_and_kv_sizes():
    log = ("llama_kv_cache: size =   45.00 MiB (  2048 cells,  30 layers,  4/4 seqs), K (f16):   22.50 MiB, V (f16):   22.50 MiB\n"
           "llama_kv_cache: size =    5.00 MiB (   256 cells,  30 layers,  4/4 seqs), K (turbo3):    2.50 MiB, V (turbo3):    2.50 MiB\n"
           "[1]18.5,[2]20.1\nFinal estimate: PPL = 23.3799 +/- 2.33485\n")
    r = parse_output("f16", log)
    assert (r.ppl, r.ppl_err) == (23.3799, 2.33485)
    assert (r.kv_mib, r.kv_k_mib, r.kv_v_mib) == (50.0, 25.0, 25.0)
    assert r.kld is None


def test_parse_failure_is_a_tqerror():
    with pytest.raises(TqError):
        parse_output("x", "llama_model_load: error loading model\n")


def test_too_short_text_and_error_lines():
    """A text under two contexts: llama-perplexity logs an error (at exit 0) and the memory table after it; the
    error says so, with what to do, and exit code 2 (bad input). Other failures show the lines logged as errors."""
    log = ("0.00.123.668 I load: special tokens cache size = 17\n"
           "0.00.210.551 E perplexity: you need at least 1024 tokens to evaluate perplexity with a context of 512\n"
           "0.00.210.618 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free |\n"
           "0.00.210.620 I common_memory_breakdown_print: |   - Host  |  235 =  92 +  45 |\n")
    with pytest.raises(TqError) as e:
        parse_output("f16", log)
    assert e.value.code == 2 and "needs at least 1024 tokens at -c 512" in e.value.message
    assert "longer text" in e.value.hint
    with pytest.raises(TqError) as e:
        parse_output("f16", log.replace("you need at least 1024 tokens to evaluate perplexity with a context of 512",
                                        "failed to tokenize"))
    assert e.value.message.endswith(": perplexity: failed to tokenize") and e.value.code == 1


def test_cache_config():
    assert CacheConfig.parse("q8_0/turbo4").args() == ["-ctk", "q8_0", "-ctv", "turbo4"]
    assert CacheConfig.parse("turbo3").label == "turbo3" and CacheConfig.parse("turbo3").v == "turbo3"
    with pytest.raises(TqError):
        CacheConfig.parse("/q8_0")


def test_bench_jsonl_and_ratio_table():
    from tqgguf.bench_sweep import add_ratios, bench_table, parse_bench_jsonl

    line = ('{"build_commit": "0c1e570", "cpu_info": "Test CPU", "gpu_info": "", "n_threads": 2, "type_k": "%s", '
            '"type_v": "%s", "n_prompt": %d, "n_gen": %d, "n_depth": %d, "avg_ts": %f, "stddev_ts": 0.5}')
    rows = parse_bench_jsonl("f16", "noise\n" + line % ("f16", "f16", 512, 0, 4096, 100.0) + "\n"
                             + line % ("f16", "f16", 0, 64, 4096, 40.0))
    rows += parse_bench_jsonl("turbo3", line % ("turbo3", "turbo3", 0, 64, 4096, 36.0))
    assert [(r.test, r.depth) for r in rows] == [("pp512", 4096), ("tg64", 4096), ("tg64", 4096)]
    add_ratios(rows)
    assert "| turbo3 | tg64 | 4096 | 36.00 ± 0.50 | 0.90" in bench_table(rows)