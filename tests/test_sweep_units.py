"""The sweep commands' parts that need no llama.cpp run: parsers against recorded outputs of the pinned tools
(tests/data: a PPL run that saved the f16 logits, a --kl-divergence run, a failed run, runs killed part-way, llama-bench
and llama-batched-bench output), the resumable store, the significance rule, plots, and bad input on the CLI."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tqgguf.errors import TqError
from tqgguf.perplexity import CacheConfig, parse_output

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


def read(name: str) -> str:
    return (DATA / name).read_text()


# ---- llama-perplexity output -------------------------------------------------------------------


def test_recorded_base_run():
    """f16 with --kl-divergence-base: `[1]12.1114,[2]21.6750,` then the final estimate; KV size at -lv 4."""
    from tqgguf.ppl_sweep import progress_of

    r = parse_output("f16", read("perplexity-base.log"))
    assert (r.ppl, r.ppl_err) == (21.6750, 3.18172)
    assert (r.kv_mib, r.kv_k_mib, r.kv_v_mib) == (45.0, 22.5, 22.5)
    assert r.kld is None
    p = progress_of(read("perplexity-base.log"))
    assert (p.done, p.total) == (2, 2) and p.seconds_per_pass == pytest.approx(5.30)


def test_recorded_kld_run():
    from tqgguf.ppl_sweep import progress_of

    r = parse_output("turbo3", read("perplexity-kld-turbo3.log"))
    assert (r.ppl, r.ppl_err) == (26.746502, 3.947448)
    assert (r.kld, r.kld_err) == (0.252709, 0.022136)
    assert r.kld_p99 == 1.903650 and r.kld_max == 5.324613 and r.kld_median == 0.129889
    assert (r.same_top, r.same_top_err) == (74.510, 1.932)
    assert (r.ppl_ratio, r.ppl_ratio_err) == (1.241322, 0.055084)
    assert r.ppl_base == 21.546788
    assert r.kv_mib == 9.14
    p = progress_of(read("perplexity-kld-turbo3.log"))
    assert (p.done, p.total) == (2, 2)


def test_recorded_failed_run():
    from tqgguf.ppl_sweep import _cause

    log = read("perplexity-failed.log")
    with pytest.raises(TqError) as e:
        parse_output("f16", log)
    assert e.value.code == 1
    assert _cause(log) == "llama_perplexity: unable to load model"


@pytest.mark.parametrize("name, done, total", [("perplexity-interrupted.log", 4, 8),
                                               ("perplexity-kld-interrupted.log", 2, 4)])
def test_recorded_interrupted_runs(name, done, total):
    """Killed part-way: no result (an error, not a half-parsed number), and the progress it had reached."""
    from tqgguf.ppl_sweep import progress_of

    with pytest.raises(TqError):
        parse_output("x", read(name))
    p = progress_of(read(name))
    assert (p.done, p.total) == (done, total)


def test_chunk_progress_in_small_pieces():
    """Output arrives in arbitrary pieces (a chunk number or a ± may be cut): the same progress as whole."""
    from tqgguf.ppl_sweep import ChunkProgress

    for name, want in (("perplexity-interrupted.log", (4, 8)), ("perplexity-kld-turbo3.log", (2, 2))):
        text = read(name)
        p = ChunkProgress()
        seen = []
        for i in range(0, len(text), 7):
            if p.feed(text[i:i + 7]):
                seen.append((p.done, p.total))
        assert (p.done, p.total) == want
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)   # never goes back


def test_stream_keeps_characters_split_across_reads(tmp_path):
    from tqgguf.toolrun import stream

    script = ("import sys,time\nb='0.25 \u00b1 0.01\\n'.encode()\nfor i in range(len(b)):\n"
              "    sys.stdout.buffer.write(b[i:i+1]); sys.stdout.flush(); time.sleep(0.01)\n"
              "sys.stderr.write('err line\\n')\n")
    pieces = []
    run = stream([sys.executable, "-c", script], "test", lambda p, w: pieces.append(w))
    assert run.returncode == 0
    assert run.stdout == "0.25 \u00b1 0.01\n" and run.stderr == "err line\n"
    assert "stdout" in pieces and "stderr" in pieces


# ---- cache configs -------------------------------------------------------------------------------


def test_cache_config_with_boundary_suffix():
    c = CacheConfig.parse("turbo4/turbo2+bv2")
    assert (c.k, c.v, c.boundary_n, c.boundary_type) == ("turbo4", "turbo2", 2, "q8_0")
    assert c.args() == ["-ctk", "turbo4", "-ctv", "turbo2", "--cache-boundary-layers", "2",
                        "--cache-type-v-boundary", "q8_0"]
    assert c.label == "turbo4/turbo2+bv2"
    assert CacheConfig.parse("turbo4/turbo2+b4:f16").label == "turbo4/turbo2+bv4:f16"
    assert CacheConfig.parse("q8_0").nominal_bits_per_value() == 8.5
    for bad in ("turbo5", "q8_0/", "q8_0/turbo4+x2", "+bv2", "f16/turbo3+bv2:q9"):
        with pytest.raises(TqError):
            CacheConfig.parse(bad)


def test_parse_configs_dedups_and_rejects_empty():
    from tqgguf.ppl_sweep import parse_configs

    assert [c.label for c in parse_configs("f16, q8_0,q8_0/q8_0,turbo3")] == ["f16", "q8_0", "turbo3"]
    with pytest.raises(TqError):
        parse_configs(" , ")


# ---- store ---------------------------------------------------------------------------------------


def test_store_resumes_and_survives_a_cut_line(tmp_path):
    from tqgguf.sweep_store import Store, record_key

    path = tmp_path / "s.jsonl"
    st = Store.open(path)
    a = st.append({"config": "f16", "ctx": 512}, {"ppl": 1.0})
    assert a["key"] == record_key({"ctx": 512, "config": "f16"})  # field order does not matter
    st.append({"config": "q8_0", "ctx": 512}, {"ppl": 2.0})
    with open(path, "a") as f:
        f.write('{"key": "cut mid-wri')  # a kill while writing
    st = Store.open(path)
    assert st.skipped_lines == 1 and len(st.records) == 2
    st.append({"config": "q8_0", "ctx": 512}, {"ppl": 3.0})  # a rerun: the newest wins
    st = Store.open(path)
    assert st.skipped_lines == 1
    assert st.get(record_key({"config": "q8_0", "ctx": 512}))["result"] == {"ppl": 3.0}
    assert len(st.latest()) == 2 and len(st.records) == 3
    assert st.get(record_key({"config": "q8_0", "ctx": 1024})) is None


# ---- significance ----------------------------------------------------------------------------------


def test_differ_rule():
    from tqgguf.tables import differ, fmt_pm

    assert not differ(0.0120, 0.0003, 0.0115, 0.0003)    # 0.0005 < 2 x 0.00042
    assert differ(0.0120, 0.0003, 0.0100, 0.0003)
    assert not differ(1.0, float("nan"), 2.0, 0.1)        # unknown error: never a winner
    assert fmt_pm(0.004021, 0.000131, 5) == "0.00402 ± 0.00013"
    assert fmt_pm(0.0000012, 0.00000031, 5) == "0.00000120 ± 0.00000031"


def _rows():
    from tqgguf.ppl_sweep import PplRow

    return [PplRow("f16", "base", kv_mib=45.0, ppl=20.0, ppl_err=1.0),
            PplRow("f16 (floor)", "floor", kv_mib=45.0, ppl=20.0, ppl_err=1.0, ppl_ratio=1.003, ppl_ratio_err=0.003,
                   kld=0.0, kld_err=0.0, kld_p99=3.6e-5),
            PplRow("q8_0", "kld", kv_mib=23.91, ppl=20.1, ppl_err=1.0, ppl_ratio=1.005, ppl_ratio_err=0.004,
                   kld=0.0040, kld_err=0.0001, kld_p99=0.02),
            PplRow("q8_0/turbo4", "kld", kv_mib=17.93, ppl=20.2, ppl_err=1.0, ppl_ratio=1.012, ppl_ratio_err=0.003,
                   kld=0.0122, kld_err=0.0003, kld_p99=0.09),
            PplRow("q8_0/q4_0", "kld", kv_mib=18.28, ppl=20.2, ppl_err=1.0, ppl_ratio=1.010, ppl_ratio_err=0.003,
                   kld=0.0118, kld_err=0.0003, kld_p99=0.08)]


def test_table_sorted_by_bits_and_no_false_winners():
    from tqgguf.ppl_sweep import CacheConfig as C
    from tqgguf.ppl_sweep import annotate, markdown_table

    rows = _rows()
    for r in rows:
        r.bits_per_value = round(16 * r.kv_mib / 45.0, 3)
    rows.sort(key=lambda r: -r.bits_per_value)
    annotate(rows)
    by = {r.config: r for r in rows}
    assert by["f16"].vs_above == "base" and by["f16 (floor)"].vs_above == "floor"
    assert by["q8_0"].vs_above == "> f16 (floor)"
    # q8_0/q4_0 (6.5 bits) vs q8_0 (8.5): a real difference; q8_0/turbo4 vs q8_0/q4_0: inside the error bars
    assert by["q8_0/q4_0"].vs_above.startswith("x2.95 q8_0")
    assert by["q8_0/turbo4"].vs_above == "≈ q8_0/q4_0"
    assert by["q8_0"].ppl_ratio_sig is False and by["q8_0/turbo4"].ppl_ratio_sig is True
    md = markdown_table(rows)
    lines = md.splitlines()
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == ["f16", "f16 (floor)", "q8_0", "q8_0/q4_0", "q8_0/turbo4"]
    assert "1.0050 ± 0.0040 ≈1" in md and "< 0.0000005" in md
    assert C.parse("q8_0").label == "q8_0"


# ---- llama-bench / llama-batched-bench -----------------------------------------------------------


def test_recorded_llama_bench_and_ratios():
    from tqgguf.bench_sweep import add_ratios, bench_table, parse_bench_jsonl

    text = read("llama-bench-tiny.jsonl")
    lines = text.splitlines()
    rows = parse_bench_jsonl("f16", "\n".join(lines[:4])) + parse_bench_jsonl("turbo3", "\n".join(lines[4:]))
    assert [(r.config, r.test, r.depth) for r in rows] == [
        (c, t, d) for c in ("f16", "turbo3") for d in (0, 512) for t in ("pp64", "tg16")]
    t = next(r for r in rows if (r.config, r.test, r.depth) == ("turbo3", "tg16", 0))
    f = next(r for r in rows if (r.config, r.test, r.depth) == ("f16", "tg16", 0))
    assert t.avg_ts == pytest.approx(542.826690) and t.stddev_ts == pytest.approx(12.164817)
    assert t.n_threads == 2 and t.extra["cpu_info"] == "AMD EPYC"
    add_ratios(rows, {"f16": "a", "turbo3": "a"})
    assert t.ratio == pytest.approx(t.avg_ts / f.avg_ts)
    rel = math.hypot(t.stddev_ts / t.avg_ts, f.stddev_ts / f.avg_ts)
    assert t.ratio_err == pytest.approx(t.ratio * rel) and t.ratio_note == ""
    assert f.ratio == 1.0
    add_ratios(rows, {"f16": "a", "turbo3": "b"})   # f16 from another invocation: marked
    assert t.ratio_note == "*"
    assert "| turbo3 | tg16 | 0 |" in bench_table(rows)
    assert parse_bench_jsonl("x", read("llama-bench-failed.log")) == []
    assert parse_bench_jsonl("x", lines[0][:200]) == []   # a line cut by a kill


def test_pool_rows_merges_repeated_runs():
    """Interleaved rounds (scripts/h200_run.sh with TQ_BENCH_ROUNDS) give one llama-bench line per round and test:
    pool_rows keeps one row per (config, test, depth), with the mean and sample spread of all repetitions."""
    from tqgguf.bench_sweep import SpeedRow, parse_bench_jsonl, pool_rows

    lines = read("llama-bench-tiny.jsonl").splitlines()
    once = parse_bench_jsonl("f16", "\n".join(lines[:4]))
    assert pool_rows(once) == once                       # nothing repeated: the rows as they were
    twice = parse_bench_jsonl("f16", "\n".join(lines[:4] + lines[:4]))
    pooled = pool_rows(twice)
    assert [(r.config, r.test, r.depth) for r in pooled] == [(r.config, r.test, r.depth) for r in once]
    for p, r in zip(pooled, once):
        samples = [float(x) for x in r.extra["samples_ts"]] * 2
        mean = sum(samples) / len(samples)
        sd = math.sqrt(sum((x - mean) ** 2 for x in samples) / (len(samples) - 1))
        assert p.avg_ts == pytest.approx(mean) and p.stddev_ts == pytest.approx(sd)
        assert p.extra["runs"] == 2 and len(p.extra["samples_ts"]) == len(samples)
    a = SpeedRow("turbo3", "tg128", 0, 100.0, 0.0)    # rows without samples count as one sample each
    b = SpeedRow("turbo3", "tg128", 0, 110.0, 0.0)
    (m,) = pool_rows([a, b])
    assert m.avg_ts == pytest.approx(105.0) and m.stddev_ts == pytest.approx(math.sqrt(50.0))


def test_bench_rounds_script(tmp_path):
    """scripts/bench_rounds.py: rounds from llama-bench lines (by a "round" key, else by repetition), ratios to
    f16 pooled and per round, a setting as part of the label, clear exit codes on bad input."""
    import json as _json

    def line(k, v, ts, rnd=None, setting=None):
        d = {"type_k": k, "type_v": v, "n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": ts, "stddev_ts": 0.0,
             "samples_ts": [ts, ts]}
        if rnd is not None:
            d["round"] = rnd
        if setting is not None:
            d["setting"] = setting
        return _json.dumps(d)

    script = [sys.executable, str(Path(__file__).parent.parent / "scripts" / "bench_rounds.py")]
    # h200_run.sh's rounds: no round key, the n-th run of a config is round n; the second round's turbo3 was cut
    f = tmp_path / "bench.jsonl"
    f.write_text("\n".join([line("f16", "f16", 100.0), line("turbo3", "turbo3", 130.0), "log line",
                            line("f16", "f16", 200.0), line("turbo3", "turbo3", 250.0), '{"type_k": "cut']) + "\n")
    p = subprocess.run(script + [str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "| turbo3 | tg128 | 0 | 1.300, 1.250 |" in p.stdout
    # pooled: turbo3's mean 190 over f16's 150
    assert "| turbo3 | tg128 | 0 | 190.00 ± 69.28 | 1.27" in p.stdout
    # run-switches.sh's lines: round and setting keys; an asymmetric config's label is K/V
    f.write_text("\n".join([line("f16", "f16", 100.0, 1, "default"), line("turbo3", "turbo3", 120.0, 1, "X=0"),
                            line("q8_0", "turbo4", 110.0, 1, "default")]) + "\n")
    p = subprocess.run(script + [str(f)], capture_output=True, text=True)
    assert "| turbo3 X=0 | tg128 | 0 | 1.200 |" in p.stdout and "| q8_0/turbo4 | tg128 | 0 | 1.100 |" in p.stdout
    f.write_text("no json here\n")
    p = subprocess.run(script + [str(f)], capture_output=True, text=True)
    assert p.returncode == 1 and "no llama-bench JSON lines" in p.stderr
    p = subprocess.run(script + [str(tmp_path / "missing.jsonl")], capture_output=True, text=True)
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr


def test_recorded_batched_bench():
    from tqgguf.bench_sweep import parse_batched_jsonl, parse_batched_md

    rows = parse_batched_jsonl("turbo3", read("batched-bench.jsonl"))
    assert [(r.test, r.depth) for r in rows] == [(f"pp128+tg16 {w}", pl) for pl in (2, 4) for w in ("all", "pp", "tg")]
    assert rows[0].avg_ts == pytest.approx(4556.240723) and rows[0].extra["n_kv"] == 288
    assert rows[5].avg_ts == pytest.approx(1521.816650)
    md = parse_batched_md("turbo3", read("batched-bench.md"))
    assert [(r.test, r.depth) for r in md] == [(r.test, r.depth) for r in rows]
    assert md[3].avg_ts == pytest.approx(5539.47) and md[3].extra["n_kv"] == 576


def test_parse_list():
    from tqgguf.bench_sweep import parse_list

    assert parse_list("4096,0,4096", "--depth") == [0, 4096]
    for bad in ("", "a,1", "-1"):
        with pytest.raises(TqError):
            parse_list(bad, "--depth")


# ---- niah ----------------------------------------------------------------------------------------


class FakeClient:
    """Words as tokens; a chat template that adds a few words."""

    def tokenize(self, text, add_special=False):
        return list(range(len(text.split())))

    def detokenize(self, tokens):
        words = self._words
        return " ".join(words[t] for t in tokens)

    def apply_template(self, messages):
        return "<user> " + messages[0]["content"] + " <assistant> "


def test_haystack_prompt_fits_and_places_the_needle():
    from tqgguf.niah import Haystack, make_needle, wilson

    filler = " ".join(f"Sentence number {i} is here." for i in range(3000))
    fc = FakeClient()
    fc._words = filler.split()
    hay = Haystack(fc, filler, 1024)
    for depth in (0, 50, 100):
        needle = make_needle(0, 1024, depth, 0)
        prompt, n = hay.prompt(1024, depth, needle, 24)
        assert n <= 1000 and n == len(prompt.split())
        pos = prompt.split().index("secret") / n
        assert abs(pos - depth / 100) < 0.08, (depth, pos)
        assert prompt.endswith("The secret passphrase is")
    assert make_needle(0, 1024, 50, 0) == make_needle(0, 1024, 50, 0) != make_needle(0, 1024, 50, 1)
    n = make_needle(1, 2048, 25, 0)
    assert n.found_in(f"The passphrase is **{n.passphrase.upper().replace('-', ' ')}**")
    assert not n.found_in("The passphrase is " + n.passphrase.split("-")[1])
    assert n.number_in("it is " + n.passphrase.split("-")[1] + ".")
    lo, hi = wilson(0, 2)
    assert lo == 0.0 and hi == pytest.approx(0.658, abs=0.01)
    assert wilson(10, 10)[1] == 1.0


# ---- plots ---------------------------------------------------------------------------------------


def test_plots_are_png(tmp_path):
    pytest.importorskip("matplotlib")
    from tqgguf.bench_sweep import SpeedRow
    from tqgguf.plot import plot_batched, plot_bench, plot_niah, plot_ppl

    rows = _rows()
    for r in rows:
        r.bits_per_value = round(16 * r.kv_mib / 45.0, 3)
    paths = [plot_ppl(rows, tmp_path / "ppl.png"),
             plot_bench([SpeedRow(c, "tg16", d, 100.0 - d / 100, 1.0) for c in ("f16", "turbo3") for d in (0, 512)],
                        tmp_path / "bench.png"),
             plot_batched([SpeedRow(c, "pp8+tg8 all", n, 10.0 * n, 0.0) for c in ("f16", "q8_0") for n in (1, 2, 4)],
                          tmp_path / "batched.png"),
             plot_niah([{"config": c, "ctx": 2048, "depth": d, "accuracy": 0.5} for c in ("f16", "q8_0")
                        for d in (0, 100)], tmp_path / "niah.png")]
    for p in paths:
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5000


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch):
    from tqgguf import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(TqError) as e:
        plot.pyplot()
    assert "tqgguf[plot]" in e.value.hint


# ---- the CLI on bad input: one line, exit 2, no traceback ------------------------------------------


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tqgguf", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def fake_bin(tmp_path) -> dict:
    """A bin folder with stand-in tools: enough for the checks that come before any run."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("llama-perplexity", "llama-bench", "llama-batched-bench", "llama-server"):
        (d / name).write_text("#!/bin/sh\nexit 3\n")
        (d / name).chmod(0o755)
    env = dict(os.environ, TQGGUF_BIN_DIR=str(d), TQGGUF_CACHE=str(tmp_path / "cache"), NO_COLOR="1", COLUMNS="200")
    return env


@pytest.mark.parametrize("args, needle", [
    (["ppl", "-m", "/nonexistent/model.gguf", "-f", __file__], "model file not found: /nonexistent/model.gguf"),
    (["ppl", "-m", __file__, "-f", "/nonexistent.txt"], "text file not found"),
    (["ppl", "-m", __file__, "-f", __file__], "is not a GGUF file"),
    (["ppl", "-m", __file__, "-f", __file__, "--configs", "q8_0,turbo9"], "unknown K cache type 'turbo9'"),
    (["ppl", "-m", __file__, "-f", __file__, "--chunks", "0"], "--chunks must be >= 1"),
    # llama-perplexity prints no KL-divergence summary below 100 scored tokens (half of each chunk)
    (["ppl", "-m", __file__, "-f", __file__, "-c", "128", "--chunks", "1"], "1 chunk(s) of 128 tokens score 63 tokens"),
    (["ppl", "-m", __file__, "-f", __file__, "stray"], "unexpected argument 'stray'"),
    (["bench", "-m", "/nonexistent/model.gguf"], "model file not found"),
    (["bench", "-m", __file__, "--depth", "0,x"], "--depth must be comma-separated integers"),
    (["bench", "-m", __file__, "--mem", "1GiB"], "go with --batched"),
    (["bench", "-m", __file__, "--batched", "--mem", "lots"], "--mem"),
    (["niah", "-m", "/nonexistent/model.gguf", "--ctx", "2048"], "model file not found"),
    (["niah", "-m", __file__, "--depths", "0,150"], "percentages"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, fake_bin):
    r = _cli(args, fake_bin)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert needle in r.stderr.splitlines()[0], r.stderr


def test_missing_build_is_a_clear_error(tmp_path):
    env = dict(os.environ, TQGGUF_BIN_DIR=str(tmp_path), NO_COLOR="1", COLUMNS="200")
    r = _cli(["ppl", "-m", __file__, "-f", __file__], env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"no llama-perplexity in $TQGGUF_BIN_DIR ({tmp_path})" in r.stderr
    r = _cli(["bench", "-m", __file__, "--bin-dir", str(tmp_path)], dict(env, TQGGUF_BIN_DIR=""))
    assert r.returncode == 2 and f"no llama-bench in --bin-dir {tmp_path}" in r.stderr


def test_failing_tool_is_exit_1_with_its_reason(fake_bin, tmp_path):
    """The f16 base failing stops the sweep (exit 1), naming the tool and its exit code."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    r = _cli(["ppl", "-m", str(gguf), "-f", __file__, "--out", str(tmp_path / "o")], fake_bin)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "llama-perplexity failed for f16 (exit 3)" in r.stderr


def test_failed_config_is_named_with_its_log_and_retried(fake_bin, tmp_path):
    """A config whose tool fails (not f16) is reported at the end with where its log is (exit 1), and is not recorded
    as measured: a rerun runs it again."""
    bench = Path(fake_bin["TQGGUF_BIN_DIR"]) / "llama-bench"
    f16_lines = tmp_path / "f16.jsonl"
    f16_lines.write_text("\n".join(read("llama-bench-tiny.jsonl").splitlines()[:4]) + "\n")
    bench.write_text(f'#!/bin/sh\ncase " $* " in *" turbo3 "*) echo "no turbo3 here" >&2; exit 3;; esac\n'
                     f'cat "{f16_lines}"\n')
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    out = tmp_path / "o"
    args = ["bench", "-m", str(gguf), "--configs", "turbo3", "--depth", "0", "-p", "64", "-n", "16", "--out", str(out)]
    for _ in range(2):
        r = _cli(args, fake_bin)
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert "llama-bench failed for turbo3 (exit 3): no turbo3 here" in r.stderr
        assert f"1 config(s) failed: turbo3 (logs in {out / 'logs'}); a rerun retries them" in r.stderr
        assert "already measured" not in r.stderr
        log = out / "logs" / "bench-turbo3.log"   # removed after the first run: the rerun writes it again
        assert "no turbo3 here" in log.read_text()
        log.unlink()


def test_help_has_examples():
    for cmd in ("ppl", "bench", "niah"):
        r = _cli([cmd, "--help"], dict(os.environ, COLUMNS="200", NO_COLOR="1"))
        assert r.returncode == 0 and "Examples" in r.stdout and f"tqgguf {cmd} -m" in r.stdout


def test_batched_fit_counts_the_boundary_layers():
    """bench --batched with a budget: a +bvN config's boundary layers hold V at their type, so fewer sequences fit
    than for the same pair without the policy (they were not counted before); a boundary type that raises nothing
    says so."""
    from tqgguf import kvcompat, kvmem
    from tqgguf.bench_sweep import fit_sequences
    from tqgguf.gguf_check import load_facts
    from tqgguf.models import smollm2_path
    from tqgguf.perplexity import CacheConfig

    model = smollm2_path()
    _, facts = load_facts(model)
    # exactly 40 sequences of 4096 tokens of turbo2 fit this budget
    rt = kvmem.Runtime(ctx=40 * 4096, n_seq=40, unified=False)
    budget = facts.weights_bytes + kvmem.kv_size(facts, rt, "turbo4", "turbo2").total + kvmem.compute_margin(facts, rt)
    cfgs = [CacheConfig.parse(c) for c in ("turbo4/turbo2", "turbo4/turbo2+bv2", "q8_0/q8_0+bv2")]
    fits = fit_sequences(model, cfgs, 4096, budget)
    assert fits["turbo4/turbo2"]["sequences"] == 40 and fits["turbo4/turbo2"]["note"] == ""
    assert fits["turbo4/turbo2+bv2"]["sequences"] < 40 and fits["turbo4/turbo2+bv2"]["note"] == ""
    b = kvcompat.boundary_v(facts, "turbo2", 2, "q8_0")
    n = fits["turbo4/turbo2+bv2"]["sequences"]
    rt_n = kvmem.Runtime(ctx=n * 4096, n_seq=n, unified=False)
    need = facts.weights_bytes + kvmem.kv_size(facts, rt_n, "turbo4", "turbo2", b.v_layers).total \
        + kvmem.compute_margin(facts, rt_n)
    assert fits["turbo4/turbo2+bv2"]["need_mib"] == round(need / kvmem.MIB, 1)
    assert "changes nothing" in fits["q8_0+bv2"]["note"]


# ---- the f16 reference's own speed on AVX512-FP16 CPUs ----------------------------------------------

_CPU_MANIFEST = {"backends": ["cpu"], "cmake_args": ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"],
                 "compiler": {"machine": "x86_64"}}
_FP16_CPU = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_fp16 amx_tile\n"
_AVX512_CPU = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"


@pytest.mark.parametrize("manifest, ngl, dims, cpuinfo, expect", [
    (_CPU_MANIFEST, None, {64}, _FP16_CPU, "head dim 64"),
    (_CPU_MANIFEST, None, {64, 192, 128}, _FP16_CPU, "head dim 64/192"),
    (_CPU_MANIFEST, None, {128, 256}, _FP16_CPU, None),                  # whole steps: f16's SIMD loop
    (_CPU_MANIFEST, None, {64}, _AVX512_CPU, None),                      # AVX512F alone: steps of 64
    (_CPU_MANIFEST, None, {64}, None, None),                             # no /proc/cpuinfo
    (_CPU_MANIFEST | {"cmake_args": ["-DGGML_NATIVE=OFF"]}, None, {64}, _FP16_CPU, None),
    (_CPU_MANIFEST | {"compiler": {"machine": "aarch64"}}, None, {64}, _FP16_CPU, None),
    (_CPU_MANIFEST | {"backends": ["cpu", "cuda"]}, None, {64}, _FP16_CPU, None),   # layers on the GPU
    (_CPU_MANIFEST | {"backends": ["cpu", "cuda"]}, "0", {64}, _FP16_CPU, "head dim 64"),
    (None, None, {64}, _FP16_CPU, None),                                 # no manifest: nothing known
    (_CPU_MANIFEST, None, set(), _FP16_CPU, None),                       # model unreadable
])
def test_f16_reference_note(manifest, ngl, dims, cpuinfo, expect):
    """`tqgguf bench` says when its reference, f16, decodes on ggml's scalar f16 code (AVX512-FP16 works in steps of
    128 values), which makes every decode ratio to f16 look better than the cache itself makes it."""
    from tqgguf.bench_sweep import f16_reference_note

    note = f16_reference_note(manifest, ngl, dims, cpuinfo)
    if expect is None:
        assert note is None
    else:
        assert note is not None and expect in note and "q8_0" in note


def test_f16_reference_note_in_the_report(tmp_path, monkeypatch):
    """The note reaches the report, and the head dims come from the model file."""
    from test_check import write_model

    from tqgguf import bench_sweep
    from tqgguf.bench_sweep import BenchResult, BenchSpec, _head_dims, report_markdown

    model = write_model(tmp_path / "m.gguf", n_embd=256, n_head=4, n_head_kv=2)    # head dim 64
    assert _head_dims(model) == {64}
    assert _head_dims(tmp_path / "missing.gguf") == set()
    spec = BenchSpec(binary=tmp_path / "llama-bench", model=model, configs=[], out=tmp_path / "out")
    meta = {"model": str(model), "depths": [0], "reps": 1, "p": 8, "n": 4, "threads": None, "date": "d",
            "device": "cpu", "build": {"build_hash": "h", "llama_cpp": "c", "patches": []},
            "notes": [bench_sweep.f16_reference_note(_CPU_MANIFEST, None, _head_dims(model), _FP16_CPU)]}
    text = report_markdown(BenchResult(spec, [], {}, [], [], [], meta))
    assert "- note: f16 decode on this CPU runs ggml's scalar f16 code for head dim 64" in text
