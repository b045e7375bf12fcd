"""tqgguf.synth: random-weight GGUF writer.

Writes tiny models of the KV-cache shapes we care about, re-reads them with gguf.GGUFReader and
loads them with llama.cpp (llama-perplexity) to check the logits are finite.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import subprocess
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from tqgguf import synth as S

PPL_RE = re.compile(r"Final estimate: PPL = (\S+)")


@pytest.fixture(scope="module")
def small_text(tmp_path_factory) -> Path:
    """~1200 words: well over the 2*128 tokens llama-perplexity needs for -c 128."""
    rng = random.Random(0)
    words = ("the of and to in is was for on that with as by at from his her it an were are which this "
             "be or had first one their its new after who they have two has been city during time year").split()
    lines = [" ".join(rng.choice(words) for _ in range(20)).capitalize() + " ." for _ in range(60)]
    path = tmp_path_factory.mktemp("synth_text") / "text.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _perplexity(llama_bin, model: Path, text: Path) -> tuple[float, np.ndarray]:
    """Run llama-perplexity (-c 128, 1 chunk) and return (PPL, per-token log-prob records).

    The numbers are read from the --save-all-logits file, not from the log: llama.cpp's common
    logger is an async worker thread whose singleton is leaked on purpose (llama.cpp issue
    22142), so the last lines ("Final estimate: PPL = ...") are sometimes lost at exit on a busy
    machine. The file holds, per scored token, float scale, float min_log_prob and n_vocab
    uint16 log-probs (log p = min_log_prob + q * scale).
    """
    logits_file = model.with_suffix(".logits")
    cmd = [str(llama_bin("llama-perplexity")), "-m", str(model), "-f", str(text),
           "-c", "128", "--chunks", "1", "-t", "2", "--save-all-logits", str(logits_file)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"llama-perplexity failed ({p.returncode}):\n{out[-3000:]}"

    buf = logits_file.read_bytes()
    assert buf[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = np.frombuffer(buf, dtype=np.int32, count=3, offset=8).tolist()
    assert (n_ctx, n_chunk) == (128, 1)
    off = 20
    tokens = np.frombuffer(buf, dtype=np.int32, count=n_ctx, offset=off)
    off += 4 * n_ctx
    first = n_ctx // 2
    n_tok = n_ctx - 1 - first
    nv = 2 * ((n_vocab + 1) // 2) + 4
    assert len(buf) == off + n_tok * nv * 2
    rec = np.frombuffer(buf, dtype=np.uint16, offset=off).reshape(n_tok, nv)
    head = rec[:, :4].copy().view(np.float32)          # (n_tok, 2): scale, min_log_prob
    assert np.all(np.isfinite(head)), "non-finite logits"
    assert np.all(head[:, 0] > 0), "all logits equal"
    target = tokens[first + 1:first + 1 + n_tok]
    q = rec[np.arange(n_tok), 4 + target].astype(np.float64)
    logp = head[:, 1].astype(np.float64) + q * head[:, 0]
    ppl = float(np.exp(-logp.mean()))

    m = PPL_RE.search(out)
    if m:  # the log line, when it made it out, agrees
        assert float(m.group(1)) == pytest.approx(ppl, rel=1e-3)
    return ppl, rec


def _field(r: GGUFReader, key: str):
    f = r.fields.get(key)
    assert f is not None, f"missing key {key}"
    return f.contents()


CASES = [
    # preset, vocab, weights
    ("tiny-hd128", "llama-bpe", "q8_0"),
    ("tiny-gqa8", "llama-spm", "f16"),     # head_dim 256, GQA 8:1
    ("tiny-swa", "llama-spm", "q8_0"),     # gemma3, sliding-window layers
    ("tiny-hd64", "llama-spm", "q4_0"),
    ("tiny-hd128", "llama-spm", "f32"),    # the CUDA parity step's weight type
]


@pytest.mark.build
@pytest.mark.parametrize("preset,vocab,weights", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_synth_roundtrip_and_load(preset, vocab, weights, tmp_path, llama_source, llama_bin, small_text):
    shape = S.PRESETS[preset]
    vocab_path = S.find_vocab(llama_source, vocab)
    out = tmp_path / f"{preset}-{weights}.gguf"
    info = S.synth(out, shape, vocab_path, weights=weights, seed=1)

    assert info.path == out and out.is_file()
    assert not (tmp_path / f"{preset}-{weights}.gguf.part").exists()
    assert info.file_size == out.stat().st_size
    assert info.vocab == vocab_path
    arch = "gemma3" if shape.sliding_window else "llama"
    assert info.arch == arch

    r = GGUFReader(out)
    a = arch
    assert _field(r, "general.architecture") == arch
    assert _field(r, f"{a}.block_count") == shape.n_layer
    assert _field(r, f"{a}.embedding_length") == shape.n_embd
    assert _field(r, f"{a}.feed_forward_length") == shape.ff
    assert _field(r, f"{a}.attention.head_count") == shape.n_head
    assert _field(r, f"{a}.attention.head_count_kv") == shape.n_head_kv
    assert _field(r, f"{a}.attention.key_length") == shape.head_dim
    assert _field(r, f"{a}.attention.value_length") == shape.head_dim
    assert _field(r, f"{a}.rope.dimension_count") == shape.head_dim
    assert _field(r, f"{a}.context_length") == shape.n_ctx_train
    assert _field(r, f"{a}.rope.freq_base") == pytest.approx(shape.rope_theta)

    # tokenizer: every tokenizer.* field of the vocab file, same types and values
    src = S.read_tokenizer_kv(vocab_path)
    out_tok = {k: f for k, f in r.fields.items() if k.startswith("tokenizer.")}
    assert set(out_tok) == set(src)
    for k, (vt, val, sub) in src.items():
        f = out_tok[k]
        assert f.types[0] == vt, k
        if vt == GGUFValueType.ARRAY:
            assert f.types[-1] == sub, k
            got = f.contents()
            want = [v.decode() for v in val] if sub == GGUFValueType.STRING else val
            assert len(got) == len(want), k
            assert got == want, k
        else:
            want = val.decode() if vt == GGUFValueType.STRING else val
            assert f.contents() == want, k
    n_vocab = len(src["tokenizer.ggml.tokens"][1])
    assert info.n_vocab == n_vocab
    assert _field(r, f"{a}.vocab_size") == n_vocab

    if shape.sliding_window:
        assert _field(r, f"{a}.attention.sliding_window") == shape.sliding_window
        pat = _field(r, f"{a}.attention.sliding_window_pattern")
        p = shape.swa_pattern
        assert pat == [il % p != p - 1 for il in range(shape.n_layer)]
        assert pat.count(False) == shape.n_layer // p  # full-attention layers

    # tensors: names, ggml shapes (ne0 first) and types
    qt = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
          "f16": GGMLQuantizationType.F16, "f32": GGMLQuantizationType.F32}[weights]
    tensors = {t.name: t for t in r.tensors}
    hd, E, ff = shape.head_dim, shape.n_embd, shape.ff
    expect = {
        "token_embd.weight": [E, n_vocab],
        "output.weight": [E, n_vocab],
        "output_norm.weight": [E],
    }
    for i in range(shape.n_layer):
        expect.update({
            f"blk.{i}.attn_norm.weight": [E],
            f"blk.{i}.attn_q.weight": [E, shape.n_head * hd],
            f"blk.{i}.attn_k.weight": [E, shape.n_head_kv * hd],
            f"blk.{i}.attn_v.weight": [E, shape.n_head_kv * hd],
            f"blk.{i}.attn_output.weight": [shape.n_head * hd, E],
            f"blk.{i}.ffn_norm.weight": [E],
            f"blk.{i}.ffn_gate.weight": [E, ff],
            f"blk.{i}.ffn_up.weight": [E, ff],
            f"blk.{i}.ffn_down.weight": [ff, E],
        })
        if arch == "gemma3":
            expect.update({
                f"blk.{i}.attn_q_norm.weight": [hd],
                f"blk.{i}.attn_k_norm.weight": [hd],
                f"blk.{i}.post_attention_norm.weight": [E],
                f"blk.{i}.post_ffw_norm.weight": [E],
            })
    assert set(tensors) == set(expect)
    for name, ne in expect.items():
        t = tensors[name]
        assert t.shape.tolist() == ne, name
        assert t.tensor_type == (GGMLQuantizationType.F32 if len(ne) == 1 else qt), name
    assert info.n_tensors == len(expect)
    assert info.n_params == sum(math.prod(ne) for ne in expect.values())

    # weights: norms are ones, matrices have std ~ 1/sqrt(fan_in)
    assert np.all(tensors["output_norm.weight"].data == 1.0)
    from gguf.quants import dequantize
    wq = dequantize(np.asarray(tensors["blk.0.attn_q.weight"].data), qt).astype(np.float32)
    assert np.std(wq) == pytest.approx(1 / math.sqrt(E), rel=0.1)

    ppl, _ = _perplexity(llama_bin, out, small_text)
    assert math.isfinite(ppl) and ppl > 1.0, ppl


@pytest.mark.build
def test_sliding_window_changes_logits(tmp_path, llama_source, llama_bin, small_text):
    """Same weights (per-tensor seeds), window 32 vs a window larger than the context: PPL differs."""
    vocab = S.find_vocab(llama_source, "llama-spm")
    base = S.PRESETS["tiny-swa"]
    res = []
    for win in (32, 4096):
        out = tmp_path / f"swa{win}.gguf"
        S.synth(out, replace(base, sliding_window=win), vocab, seed=3)
        res.append(_perplexity(llama_bin, out, small_text))
    (ppl_a, rec_a), (ppl_b, rec_b) = res
    assert math.isfinite(ppl_a) and math.isfinite(ppl_b)
    assert not np.array_equal(rec_a, rec_b)
    assert ppl_a != ppl_b


def test_streaming_progress_and_memory(tmp_path, llama_source):
    """progress is called once per tensor, in file order, and peak Python/numpy memory is a few
    chunks, not proportional to the file (~130 MB here)."""
    vocab = S.find_vocab(llama_source, "llama-spm")
    shape = S.SynthShape(n_layer=8, n_embd=512, n_head=4, n_head_kv=4, head_dim=128, n_ff=2048)
    calls = []
    out = tmp_path / "mid.gguf"

    tracemalloc.start()   # sanity: numpy buffers are visible to tracemalloc
    try:
        x = np.ones(5_000_000)
        _, peak0 = tracemalloc.get_traced_memory()
        del x
    finally:
        tracemalloc.stop()
    assert peak0 >= 40e6

    tracemalloc.start()
    try:
        info = S.synth(out, shape, vocab, weights="f16", progress=lambda i, n, name: calls.append((i, n, name)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert info.file_size > 120e6
    assert peak < 32e6, f"peak traced memory {peak / 1e6:.1f} MB"
    assert peak < info.file_size / 4

    names = [t.name for t in S.plan_tensors(shape, info.n_vocab, "f16")]
    assert len(calls) == len(names) == info.n_tensors
    assert [c[0] for c in calls] == list(range(1, len(names) + 1))
    assert {c[1] for c in calls} == {len(names)}
    assert [c[2] for c in calls] == names


def test_deterministic(tmp_path, llama_source):
    vocab = S.find_vocab(llama_source, "llama-spm")
    shape = replace(S.PRESETS["tiny-hd64"], n_layer=1)

    def digest(name: str, seed: int) -> str:
        out = tmp_path / name
        S.synth(out, shape, vocab, seed=seed)
        return hashlib.sha256(out.read_bytes()).hexdigest()

    a, b, c = digest("a.gguf", 7), digest("b.gguf", 7), digest("c.gguf", 8)
    assert a == b
    assert a != c


def test_read_tokenizer_kv_matches_gguf_reader(llama_source):
    vocab = S.find_vocab(llama_source, "llama-spm")
    fast = S.read_tokenizer_kv(vocab)
    ref = {k: f for k, f in GGUFReader(vocab).fields.items() if k.startswith("tokenizer.")}
    assert set(fast) == set(ref) and "tokenizer.ggml.scores" in fast
    for k, (vt, val, sub) in fast.items():
        f = ref[k]
        assert f.types[0] == vt and (sub is None or f.types[-1] == sub), k
        if sub == GGUFValueType.STRING:
            assert [v.decode() for v in val] == f.contents(), k
        elif vt == GGUFValueType.STRING:
            assert val.decode() == f.contents(), k
        else:
            assert val == f.contents(), k


def test_presets():
    s = S.PRESETS["llama3-8b"]
    assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.ff) == (32, 4096, 32, 8, 128, 14336)
    for name in ("tiny-hd64", "tiny-hd128", "tiny-hd256", "tiny-gqa8", "tiny-swa"):
        S.validate(S.PRESETS[name])
    assert S.PRESETS["tiny-hd256"].head_dim == 256
    g = S.PRESETS["tiny-gqa8"]
    assert g.n_head // g.n_head_kv == 8
    assert S.PRESETS["tiny-swa"].arch == "gemma3"
    assert S.PRESETS["llama3-8b"].arch == "llama"
    # default n_ff: 8/3 * n_embd rounded up to a multiple of 256
    assert S.SynthShape(n_layer=1, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128).ff == 11008
    # default pattern is gemma-3's 6, capped at n_layer
    assert S.swa_layers(S.SynthShape(2, 256, 4, 2, 64, sliding_window=16)) == [True, False]
    assert S.swa_layers(S.SynthShape(12, 256, 4, 2, 64, sliding_window=16)) == [il % 6 != 5 for il in range(12)]


def test_cli_list_presets_and_missing_out():
    """--list-presets needs no -o (a table, or JSON with every preset's shape); without either, one error line."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "tqgguf", "synth", *a], capture_output=True, text=True)
    r = run("--list-presets")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip()]
    assert rows[0][:3] == ["preset", "layers", "n_embd"]
    llama = next(row for row in rows if row[0] == "llama3-8b")
    assert llama[1:7] == ["32", "4096", "32", "8", "128", "14336"]
    assert {row[0] for row in rows} >= set(S.PRESETS)
    r = run("--list-presets", "--json")
    assert r.returncode == 0, r.stderr
    presets = json.loads(r.stdout)
    assert set(presets) == set(S.PRESETS)
    assert presets["tiny-swa"]["sliding_window"] == S.PRESETS["tiny-swa"].sliding_window
    r = run("--preset", "tiny-hd64")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "-o/--out" in r.stderr


BAD = [
    (dict(n_head=6, n_head_kv=4), "multiple of n_head_kv"),
    (dict(n_head_kv=8, n_head=4), "n_head_kv"),
    (dict(head_dim=63), "head_dim"),
    (dict(head_dim=0), "head_dim"),
    (dict(n_layer=0), "n_layer"),
    (dict(n_layer=513), "n_layer"),
    (dict(n_embd=100), "n_embd"),
    (dict(n_ff=1000), "n_ff"),
    (dict(swa_pattern=4), "swa_pattern requires sliding_window"),
    (dict(sliding_window=64, swa_pattern=1), "swa_pattern"),
    (dict(sliding_window=64, swa_pattern=9), "swa_pattern"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(rope_theta=0.0), "rope_theta"),
]


@pytest.mark.parametrize("change,msg", BAD, ids=[m for _, m in BAD])
def test_bad_shapes_raise(change, msg, tmp_path, llama_source):
    shape = replace(S.SynthShape(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=768), **change)
    out = tmp_path / "bad.gguf"
    with pytest.raises(ValueError, match=re.escape(msg)) as e:
        S.synth(out, shape, S.find_vocab(llama_source, "llama-spm"))
    assert "\n" not in str(e.value)
    assert not out.exists() and not (tmp_path / "bad.gguf.part").exists()


def test_bad_args_raise(tmp_path, llama_source):
    shape = S.PRESETS["tiny-hd64"]
    vocab = S.find_vocab(llama_source, "llama-spm")
    with pytest.raises(ValueError, match="weights must be one of"):
        S.synth(tmp_path / "x.gguf", shape, vocab, weights="q5_k")
    with pytest.raises(ValueError, match="seed"):
        S.synth(tmp_path / "x.gguf", shape, vocab, seed=-1)
    with pytest.raises(ValueError, match="output directory does not exist"):
        S.synth(tmp_path / "no" / "x.gguf", shape, vocab)
    with pytest.raises(ValueError, match="vocab file not found"):
        S.synth(tmp_path / "x.gguf", shape, tmp_path / "nope.gguf")
    # f16 has no block-size constraint on n_embd
    S.validate(replace(shape, n_embd=100, n_ff=300), "f16")
    with pytest.raises(ValueError) as e:
        S.find_vocab(llama_source, "no-such-vocab")
    msg = str(e.value)
    assert "\n" not in msg and "llama-bpe" in msg and "llama-spm" in msg
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.build
@pytest.mark.parametrize("weights", ["q4_0", "q8_0"])
def test_fast_weights(weights, tmp_path, llama_source, llama_bin, small_text):
    """--fast writes random codes with one scale per tensor: same std as the float path, deterministic, loadable."""
    vocab = S.find_vocab(llama_source, "llama-spm")
    shape = replace(S.PRESETS["tiny-hd64"], n_layer=2)
    a, b, slow = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "slow.gguf"
    S.synth(a, shape, vocab, weights=weights, seed=3, fast=True)
    S.synth(b, shape, vocab, weights=weights, seed=3, fast=True)
    S.synth(slow, shape, vocab, weights=weights, seed=3)
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size == slow.stat().st_size

    from gguf.quants import dequantize
    qtype = GGMLQuantizationType.Q4_0 if weights == "q4_0" else GGMLQuantizationType.Q8_0
    fast_t = {t.name: t for t in GGUFReader(a).tensors}
    slow_t = {t.name: t for t in GGUFReader(slow).tensors}
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"):
        assert fast_t[name].tensor_type == qtype
        x = dequantize(np.asarray(fast_t[name].data), qtype)
        y = dequantize(np.asarray(slow_t[name].data), qtype)
        assert x.shape == y.shape
        assert float(x.std()) == pytest.approx(float(y.std()), rel=0.05), name
        assert len(np.unique(x)) > 8  # random codes, not a constant
    ppl, _ = _perplexity(llama_bin, a, small_text)
    assert math.isfinite(ppl) and ppl > 1
