"""`tqgguf ppl`, `bench` and `niah` for real, on the CPU build: SmolLM2-135M for quality and retrieval, a small
synthetic model for speed. Kept small for CI on 2 cores (4 chunks of 512, two depths, 2048-token haystacks)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.build

REPO = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smol() -> Path:
    from tqgguf.models import smollm2_path

    return smollm2_path()


@pytest.fixture(scope="module")
def env(llama_bin, tmp_path_factory) -> dict:
    """The tools of the shared CPU build, and a cache of this module's own (the f16 logits live there)."""
    e = dict(os.environ, TQGGUF_BIN_DIR=str(llama_bin("llama-perplexity").parent),
             TQGGUF_CACHE=str(tmp_path_factory.mktemp("cache")), NO_COLOR="1", COLUMNS="200")
    e.pop("TQGGUF_API_KEY", None)
    return e


def tq(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tqgguf", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _records(path: Path) -> list[dict]:
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _llama_children(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (d / "stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if marker in cmd and "llama-perplexity" in cmd and state != "Z":
                pids.append(int(d.name))
    return pids


# ---- ppl -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ppl_sweep(smol, text_file, env, tmp_path_factory):
    """f16, q8_0, turbo3 over 4 chunks, killed after the first config and then rerun to completion."""
    out = tmp_path_factory.mktemp("ppl") / "sweep"
    args = ["ppl", "-m", str(smol), "-f", str(text_file), "--configs", "f16,q8_0,turbo3", "-c", "512", "--chunks", "4",
            "-t", "2", "--out", str(out), "--plot"]
    store = out / "ppl.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tqgguf", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and len(_records(store)) < 1:
        time.sleep(0.05)
    assert proc.poll() is None, f"the sweep ended before it could be interrupted: {proc.communicate()[1][-2000:]}"
    assert len(_records(store)) == 1, "no config finished in time"
    marker = env["TQGGUF_CACHE"]  # in every llama-perplexity command line of this module (the f16 logits)
    time.sleep(0.5)  # the next config's llama-perplexity is running now
    running = _llama_children(marker)
    os.kill(proc.pid, signal.SIGKILL)  # tqgguf only: its llama-perplexity must die with it
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while _llama_children(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = _llama_children(marker)
    first = _records(store)
    base_logits = list(Path(env["TQGGUF_CACHE"], "kld-base").glob("*.kld"))
    base_mtime = base_logits[0].stat().st_mtime_ns if base_logits else None

    r = tq(args + ["--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"out": out, "first": first, "orphans": orphans, "running": running, "rerun": r, "doc": json.loads(r.stdout),
            "base_logits": base_logits, "base_mtime": base_mtime, "args": args}


def test_killed_sweep_resumes_without_rerunning_finished_configs(ppl_sweep):
    s = ppl_sweep
    assert s["running"], "no llama-perplexity was running when tqgguf was killed"
    assert s["orphans"] == [], "llama-perplexity outlived the killed tqgguf"
    assert [(r["fields"]["config"], r["fields"]["role"]) for r in s["first"]] == [("f16", "base")]
    recs = _records(s["out"] / "ppl.jsonl")
    roles = [(r["fields"]["config"], r["fields"]["role"]) for r in recs]
    assert roles.count(("f16", "base")) == 1, "f16 was run again"
    assert sorted(roles) == sorted([("f16", "base"), ("f16", "floor"), ("q8_0", "kld"), ("turbo3", "kld")])
    assert "f16                already measured" in s["rerun"].stderr
    assert len(s["base_logits"]) == 1 and s["base_logits"][0].stat().st_mtime_ns == s["base_mtime"]
    # the final table is complete
    rows = {r["config"]: r for r in s["doc"]["rows"]}
    assert set(rows) == {"f16", "f16 (floor)", "q8_0", "turbo3"} and all(r["status"] == "ok" for r in rows.values())
    assert s["doc"]["failed"] == []


def test_sweep_outputs(ppl_sweep):
    out = ppl_sweep["out"]
    for name in ("ppl.md", "ppl.csv", "ppl.json", "ppl.jsonl"):
        assert (out / name).stat().st_size > 100, name
    png = (out / "ppl.png").read_bytes()
    assert png[:8] == PNG and len(png) > 10000
    md = (out / "ppl.md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [ln.split("|")[1].strip() for ln in table] == ["f16", "f16 (floor)", "q8_0", "turbo3"]  # by bits/value
    csv_lines = (out / "ppl.csv").read_text().splitlines()
    assert csv_lines[0].startswith("config,role,status,bits_per_value") and len(csv_lines) == 5
    meta = ppl_sweep["doc"]["meta"]
    assert meta["chunks"] == 4 and meta["ctx"] == 512 and meta["device"] and meta["build"]["build_hash"]
    assert meta["build"]["llama_cpp"] == "0c1e57098"


def test_kld_is_positive_and_above_the_f16_floor(ppl_sweep):
    rows = {r["config"]: r for r in ppl_sweep["doc"]["rows"]}
    floor = rows["f16 (floor)"]
    # the base stores log-probabilities quantized to 16 bits: the floor is tiny (its mean below the 6 decimals
    # llama-perplexity prints) but not zero (its tail is visible)
    assert 0 <= floor["kld"] < 1e-5 and floor["kld_p99"] > 0 and floor["kld_max"] > 0
    for cfg in ("q8_0", "turbo3"):
        r = rows[cfg]
        assert math.isfinite(r["kld"]) and r["kld"] > 0 and math.isfinite(r["ppl"])
        assert r["kld"] - 2 * r["kld_err"] > floor["kld"]
        assert r["kld_p99"] > floor["kld_p99"]
        assert 0 < r["same_top"] < 100
        assert r["kv_mib"] < rows["f16"]["kv_mib"]
    assert rows["turbo3"]["kld"] > rows["q8_0"]["kld"]
    assert rows["turbo3"]["vs_above"].startswith("x") and rows["turbo3"]["vs_above"].endswith("q8_0")
    assert rows["q8_0"]["bits_per_value"] == pytest.approx(8.5, abs=0.01)
    assert rows["turbo3"]["bits_per_value"] == pytest.approx(3.25, abs=0.01)


def test_f16_base_is_reused_by_another_invocation(ppl_sweep, env, tmp_path):
    """A new --out with the same model, text, context, chunks and build: f16 is not run again."""
    args = ppl_sweep["args"][:]
    args[args.index("--out") + 1] = str(tmp_path / "other")
    args[args.index("--configs") + 1] = "q8_0"
    args.remove("--plot")
    r = tq(args + ["--no-floor", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = _records(tmp_path / "other" / "ppl.jsonl")
    assert [(x["fields"]["config"], x["fields"]["role"]) for x in recs] == [("f16", "base"), ("q8_0", "kld")]
    assert recs[0]["meta"].get("reused_base") is True
    rows = {x["config"]: x for x in json.loads(r.stdout)["rows"]}
    first = {x["config"]: x for x in ppl_sweep["doc"]["rows"]}
    assert rows["q8_0"]["kld"] == first["q8_0"]["kld"]  # same logits, same binary: the same numbers


# ---- bench -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(llama_source, tmp_path_factory) -> Path:
    from tqgguf.synth import PRESETS, find_vocab, synth

    path = tmp_path_factory.mktemp("tiny") / "tiny-hd64.gguf"
    synth(path, PRESETS["tiny-hd64"], find_vocab(llama_source), weights="q8_0", seed=1)
    return path


def test_bench_on_a_synthetic_model_at_two_depths(tiny, env, tmp_path):
    out = tmp_path / "bench"
    r = tq(["bench", "-m", str(tiny), "--configs", "turbo3", "--depth", "0,256", "-p", "32", "-n", "8", "-r", "2",
            "-t", "1", "--out", str(out), "--plot", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    got = {(x["config"], x["test"], x["depth"]): x for x in doc["rows"]}
    assert set(got) == {(c, t, d) for c in ("f16", "turbo3") for t in ("pp32", "tg8") for d in (0, 256)}
    for x in got.values():
        assert x["avg_ts"] > 0 and x["n_threads"] == 1 and x["ratio"] is not None and math.isfinite(x["ratio"])
        assert x["ratio_note"] == ""  # f16 from the same invocation
    assert all(got[("f16", t, d)]["ratio"] == 1.0 for t in ("pp32", "tg8") for d in (0, 256))
    assert doc["meta"]["depths"] == [0, 256] and doc["meta"]["device"]
    assert (out / "bench.png").read_bytes()[:8] == PNG
    md = (out / "bench.md").read_text()
    assert "| turbo3 | tg8 | 256 |" in md
    # a rerun measures nothing: everything is in the store
    r2 = tq(["bench", "-m", str(tiny), "--configs", "turbo3", "--depth", "0,256", "-p", "32", "-n", "8", "-r", "2",
             "-t", "1", "--out", str(out), "--json"], env)
    assert r2.returncode == 0 and r2.stderr.count("already measured") == 2
    assert json.loads(r2.stdout)["rows"] == doc["rows"]


def test_batched_bench_with_2_and_4_sequences(tiny, env, tmp_path):
    out = tmp_path / "batched"
    r = tq(["bench", "-m", str(tiny), "--batched", "--configs", "turbo3", "--npl", "2,4", "-p", "32", "-n", "8",
            "-t", "1", "--out", str(out), "--plot", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    agg = {(x["config"], x["depth"]): x for x in doc["rows"] if x["test"] == "pp32+tg8 all"}
    assert set(agg) == {(c, n) for c in ("f16", "turbo3") for n in (2, 4)}
    for (cfg, n), x in agg.items():
        assert x["avg_ts"] > 0 and x["extra"]["n_kv"] == n * 40
    assert (out / "batched.png").read_bytes()[:8] == PNG


def test_batched_bench_at_a_memory_budget_runs_each_config_at_its_fit(tiny, env, tmp_path):
    """A budget that holds 2 sequences with an f16 cache holds more with turbo3: each runs at its own maximum."""
    from tqgguf import kvmem
    from tqgguf.bench_sweep import fit_sequences
    from tqgguf.gguf_check import load_facts
    from tqgguf.perplexity import CacheConfig

    _, facts = load_facts(tiny)
    # 512 tokens per sequence: the compute margin (one ubatch of activations) is then the same for any count
    rt2 = kvmem.Runtime(ctx=2 * 512, n_seq=2, unified=False)
    budget = facts.weights_bytes + kvmem.kv_size(facts, rt2, "f16", "f16").total + kvmem.compute_margin(facts, rt2)
    fits = fit_sequences(tiny, [CacheConfig("f16", "f16"), CacheConfig("turbo3", "turbo3")], 512, budget)
    assert fits["f16"]["sequences"] == 2 and fits["turbo3"]["sequences"] > 2
    out = tmp_path / "fit"
    r = tq(["bench", "-m", str(tiny), "--batched", "--configs", "turbo3", "-c", "512", "-p", "32", "-n", "8", "-t", "1",
            "--mem", f"{budget}B", "--npl", "1", "--max-npl", "6", "--out", str(out), "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["meta"]["npl"] == {"f16": [1, 2], "turbo3": [1, min(6, fits["turbo3"]["sequences"])]}
    md = (out / "batched.md").read_text()
    assert "sequences that fit" in md and "| run with |" in md
    n = fits["turbo3"]["sequences"]
    # the summary says how many sequences each config ran with, and why fewer than fit
    assert f"| turbo3 | {n} | {min(6, n)}{' (--max-npl)' if n > 6 else ''} |" in md, md


# ---- niah ------------------------------------------------------------------------------------------


def test_niah_on_smollm2_at_2048_tokens(smol, text_file, env, tmp_path):
    out = tmp_path / "niah"
    r = tq(["niah", "-m", str(smol), "--configs", "turbo3", "--ctx", "2048", "--depths", "0,100", "-f", str(text_file),
            "-t", "1", "--out", str(out), "--plot", "--json"], env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    totals = {t["config"]: t for t in doc["totals"]}
    assert set(totals) == {"f16", "turbo3"} and all(t["trials"] == 2 for t in totals.values())
    assert 0 <= totals["f16"]["accuracy"] <= 1  # reported, not asserted high: a 135M model misses needles
    assert doc["meta"]["device"] and doc["meta"]["build"]["build_hash"]
    answers = doc["answers"]
    assert len(answers) == 4
    for a in answers:
        assert 1900 < a["prompt_tokens"] <= 2048 - 24
        assert a["effective"]["k"] == a["config"] and a["effective"]["flash_attn"] is True
    assert {a["passphrase"] for a in answers if a["config"] == "f16"} == \
           {a["passphrase"] for a in answers if a["config"] == "turbo3"}   # the same questions for every config
    kv = {a["config"]: a["effective"]["kv_mib"] for a in answers}
    assert kv["turbo3"] < kv["f16"]
    assert (out / "niah.png").read_bytes()[:8] == PNG
    md = (out / "niah.md").read_text()
    assert "| f16 | 2048 |" in md and "| turbo3 | 2048 |" in md and "reference" in md
