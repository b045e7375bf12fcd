"""The KV memory that `tqgguf check` estimates equals what the patched llama.cpp allocates.

llama-perplexity logs one `llama_kv_cache: size = X MiB (N cells, L layers, S/T seqs), K (type): x MiB, V (type): y MiB`
line per cache (two for sliding-window models) at -lv 4. Each launch below creates a context exactly as a real run
does and stops before evaluating (--chunks 0 --no-warmup, about 0.3 s); one real one-chunk run confirms the sizes.
llama-perplexity sets n_seq = -b / -c and -c_total = n_seq x -c, per-sequence streams unless -kvu: the estimate is
made for those exact settings. Cells, layers and streams must match exactly, K and V MiB within 1% (the log prints
MiB with two decimals, so the printed value may differ from the exact one by 0.005 MiB more).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tqgguf import kvcompat, kvmem
from tqgguf.check_report import DEFAULT_CONFIGS
from tqgguf.gguf_check import load_facts
from tqgguf.perplexity import CacheConfig, run_perplexity

pytestmark = pytest.mark.build

LINE = re.compile(r"llama_kv_cache: size =\s*[\d.]+ MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/\s*(\d+) seqs\), "
                  r"K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB")
MODES = {"p1": (1, False), "p4": (4, False), "p4-unified": (4, True)}   # --parallel 1 and 4


@dataclass
class Case:
    model: Path
    ctx: int                 # -c per sequence
    ubatch: int | None = None
    ctx_p1: int | None = None  # -c for a single sequence, when it differs

    def c(self, n_seq: int) -> int:
        return self.ctx_p1 if n_seq == 1 and self.ctx_p1 else self.ctx


@dataclass
class Logged:
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


def launch(llama_bin, text: Path, case: Case, cfg: str, n_seq: int, unified: bool) -> list[Logged]:
    c = CacheConfig.parse(cfg)
    cmd = [str(llama_bin("llama-perplexity")), "-m", str(case.model), "-f", str(text), "-c", str(case.c(n_seq)),
           "-b", str(case.c(n_seq) * n_seq), "-fa", "on", "-lv", "4", *c.args(), "--chunks", "0", "--no-warmup", "-t", "2"]
    if unified:
        cmd.append("-kvu")
    if case.ubatch:
        cmd += ["-ub", str(case.ubatch)]
    for _ in range(2):   # the log is written by a thread; retry once if the line went missing
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, errors="replace")
        found = [Logged(int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5], float(m[6]), m[7], float(m[8]))
                 for m in LINE.finditer(r.stdout + r.stderr)]
        if found:
            return found
    raise AssertionError(f"no KV cache line from {' '.join(cmd)} (exit {r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}")


def estimate(case: Case, cfg: str, n_seq: int, unified: bool) -> kvmem.KvSize:
    _, facts = load_facts(case.model)
    c = CacheConfig.parse(cfg)
    k, v, err = kvcompat.config_effective(facts, c.k, c.v)
    assert err is None, err
    rt = kvmem.Runtime(ctx=case.c(n_seq) * n_seq, n_seq=n_seq, unified=unified, n_batch=case.c(n_seq) * n_seq,
                       n_ubatch=case.ubatch or 512)
    return kvmem.kv_size(facts, rt, k, v)


def deviation(est_bytes: int, logged_mib: float) -> float:
    """Relative deviation beyond the print resolution (0 when within 0.005 MiB)."""
    diff = max(0.0, abs(est_bytes / 2**20 - logged_mib) - 0.005)
    return diff / logged_mib if logged_mib else (0.0 if est_bytes == 0 else 1.0)


@pytest.fixture(scope="module")
def text(text_file, tmp_path_factory) -> Path:
    """The first 200 kB of the text: enough tokens for 2 x -c, cheap to tokenize."""
    p = tmp_path_factory.mktemp("kvtext") / "text.txt"
    p.write_text(text_file.read_text(errors="replace")[:200_000])
    return p


@pytest.fixture(scope="module")
def cases(llama_source, tmp_path_factory) -> dict[str, Case]:
    """SmolLM2-135M and synth models sized so that every logged K/V value is about 1 MiB or more at turbo2."""
    from tqgguf.models import smollm2_path
    from tqgguf.synth import PRESETS, find_vocab, synth

    d = tmp_path_factory.mktemp("kvmodels")
    vocab = find_vocab(llama_source, "llama-spm")   # 32k tokens: small logits buffers
    shapes = {
        "hd128": replace(PRESETS["tiny-hd128"], n_layer=8, n_head=8, n_head_kv=4),
        "hd256": replace(PRESETS["tiny-hd256"], n_layer=8, n_head=8, n_head_kv=2),
        "swa": replace(PRESETS["tiny-swa"], n_layer=9, n_head=8, n_head_kv=8, head_dim=256, swa_pattern=3),
        "hd96": replace(PRESETS["tiny-hd128"], head_dim=96, n_head=8, n_head_kv=8),
    }
    for name, shape in shapes.items():
        synth(d / f"{name}.gguf", shape, vocab, weights="q8_0")
    return {
        "smollm2": Case(smollm2_path(), 600),        # -c 600: padded to 768 cells
        "hd128": Case(d / "hd128.gguf", 256, ctx_p1=1024),
        "hd256": Case(d / "hd256.gguf", 256, ctx_p1=1024),
        # window 64, -ub 128: SWA cache PAD(min(cells, 64 x (unified ? 4 : 1) + 128), 256) < the full cache
        "swa": Case(d / "swa.gguf", 1024, ubatch=128),
        "hd96": Case(d / "hd96.gguf", 512),
    }


MODELS = ["smollm2", "hd128", "hd256", "swa"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", list(MODES))
def test_estimate_matches_llama_cpp(llama_bin, text, cases, model, mode):
    case = cases[model]
    n_seq, unified = MODES[mode]
    worst = 0.0
    for cfg in DEFAULT_CONFIGS:
        got = launch(llama_bin, text, case, cfg, n_seq, unified)
        est = estimate(case, cfg, n_seq, unified)
        assert [(g.cells, g.layers, g.streams, g.seqs) for g in got] == \
            [(c.cells, c.layers, c.streams, n_seq) for c in est.caches], (model, mode, cfg, got)
        assert [(g.type_k, g.type_v) for g in got] == [(est.k, est.v)] * len(got)
        for g, c in zip(got, est.caches):
            dk, dv = deviation(c.k_bytes, g.k_mib), deviation(c.v_bytes, g.v_mib)
            assert dk <= 0.01 and dv <= 0.01, (model, mode, cfg, g, c)
            assert g.k_mib >= 0.5 and g.v_mib >= 0.5      # large enough for the 1% check to mean something
            worst = max(worst, abs(c.k_bytes / 2**20 - g.k_mib) / g.k_mib, abs(c.v_bytes / 2**20 - g.v_mib) / g.v_mib)
    print(f"{model} {mode}: max deviation from the logged MiB {worst:.4%}")


def test_sliding_window_cache_sizes(cases):
    """The three SWA launches above cover each term of PAD(min(cells, n_swa x streams_factor + n_ubatch), 256)."""
    sizes = {mode: [c.cells for c in estimate(cases["swa"], "f16", *MODES[mode]).caches] for mode in MODES}
    assert sizes == {"p1": [1024, 256], "p4": [1024, 256], "p4-unified": [4096, 512]}


def test_turbo_fallback_matches_llama_cpp(llama_bin, text, cases):
    """head dim 96: turbo K/V run as q8_0 in llama.cpp, and the estimate sizes q8_0."""
    case = cases["hd96"]
    for cfg in ("turbo4", "q8_0/turbo2"):
        got = launch(llama_bin, text, case, cfg, 1, False)
        est = estimate(case, cfg, 1, False)
        assert (got[0].type_k, got[0].type_v) == ("q8_0", "q8_0") == (est.k, est.v)
        assert deviation(est.k_bytes, got[0].k_mib) <= 0.01 and deviation(est.v_bytes, got[0].v_mib) <= 0.01


def test_real_run_allocates_the_same(llama_bin, text, cases):
    """One evaluating run (1 chunk, via tqgguf.perplexity) logs the same sizes as the context-only launches."""
    case = cases["hd128"]
    res = run_perplexity(llama_bin("llama-perplexity"), case.model, text, CacheConfig.parse("q8_0/turbo3"),
                         ctx=case.ctx, chunks=1, threads=2, extra=["-b", str(case.ctx * 4)])
    est = estimate(case, "q8_0/turbo3", 4, False)
    assert deviation(est.k_bytes, res.kv_k_mib) <= 0.01 and deviation(est.v_bytes, res.kv_v_mib) <= 0.01
    assert res.ppl > 1


@pytest.mark.parametrize("model", ["smollm2", "swa"])
def test_boundary_configs_match_llama_cpp(llama_bin, text, cases, model):
    """`tqgguf check --config K/V+bvN[:T]` sizes the boundary layers' V at their type, as llama.cpp allocates them,
    in each cache of a sliding-window model too (its boundary layers fall in both caches)."""
    from tqgguf.check_report import _v_layers

    case = cases[model]
    _, facts = load_facts(case.model)
    rt = kvmem.Runtime(ctx=case.c(1), n_seq=1, unified=False, n_batch=case.c(1), n_ubatch=case.ubatch or 512)
    for cfg in ("turbo4/turbo2+bv2", "q8_0/turbo3+bv3:f16", "turbo3+bv1"):
        row, v_layers = _v_layers(facts, True, cfg)
        assert row["supported"] and v_layers, (cfg, row)
        est = kvmem.kv_size(facts, rt, row["effective_k"], row["effective_v"], v_layers)
        plain = kvmem.kv_size(facts, rt, row["effective_k"], row["effective_v"])
        assert est.v_bytes > plain.v_bytes and est.k_bytes == plain.k_bytes
        got = launch(llama_bin, text, case, cfg, 1, False)
        assert [g.cells for g in got] == [c.cells for c in est.caches]
        for g, c in zip(got, est.caches):
            assert deviation(c.k_bytes, g.k_mib) <= 0.01 and deviation(c.v_bytes, g.v_mib) <= 0.01, (model, cfg, g, c)
