"""`tqgguf check` without llama.cpp: integrity diagnoses through the CLI, shape facts, verdicts, the memory model on
hand-computed cases, fit and the rule-based recommendation. Models are small GGUFs written here with gguf-py."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter

from tqgguf import advice, kvcompat, kvmem
from tqgguf.check_report import CheckOptions, build_report, parse_size
from tqgguf.gguf_check import load_facts
from tqgguf.gguf_read import GgufError, read_gguf

MIB = 1024 * 1024


def write_model(path: Path, arch: str = "llama", n_layer: int = 2, n_embd: int = 128, n_head: int = 4,
                n_head_kv: int | list[int] = 2, head_dim: int | None = None, ctx_train: int = 4096,
                extra: dict | None = None, n_vocab: int = 96, rms_eps: bool = True) -> Path:
    """A structurally complete (not runnable) GGUF: metadata plus f32/f16 tensors of the right shapes."""
    hd = head_dim or n_embd // n_head
    w = GGUFWriter(str(path), arch)
    w.add_context_length(ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(2 * n_embd)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_vocab_size(n_vocab)
    if rms_eps:
        w.add_layer_norm_rms_eps(1e-5)
    for k, v in (extra or {}).items():
        if isinstance(v, list):
            w.add_key_value(f"{arch}.{k}", v, GGUFValueType.ARRAY, GGUFValueType.BOOL)
        else:
            w.add_uint32(f"{arch}.{k}", v)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), dtype=np.float32).astype(np.float16))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        kv = n_head_kv[i] if isinstance(n_head_kv, list) else n_head_kv
        w.add_tensor(f"blk.{i}.attn_k.weight", rng.standard_normal((max(kv, 1) * hd, n_embd), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("check_models")
    swa_pattern = [i % 3 != 2 for i in range(6)]   # 0,1 sliding, 2 full, ...
    return {
        "hd64": write_model(d / "hd64.gguf", n_head=8, n_head_kv=2, n_embd=512),
        "hd96": write_model(d / "hd96.gguf", head_dim=96),
        "hd80": write_model(d / "hd80.gguf", head_dim=80),
        "gqa8": write_model(d / "gqa8.gguf", n_head=16, n_head_kv=2, head_dim=128, n_embd=256, ctx_train=262144),
        "swa": write_model(d / "swa.gguf", arch="gemma3", n_layer=6, head_dim=128,
                           extra={"attention.sliding_window": 512, "attention.sliding_window_pattern": swa_pattern}),
        "gemma3-default": write_model(d / "g3.gguf", arch="gemma3", n_layer=12, head_dim=128,
                                      extra={"attention.sliding_window": 1024}),
        "unknown": write_model(d / "unk.gguf", arch="mystery"),
        "varkv": write_model(d / "varkv.gguf", n_layer=3, n_head=8, n_head_kv=[8, 2, 0], n_embd=512),
        "mamba": write_model(d / "mamba.gguf", arch="mamba", extra={f"ssm.{k}": 16 for k in (
            "conv_kernel", "inner_size", "state_size", "time_step_rank")}),
        "no-eps": write_model(d / "no-eps.gguf", rms_eps=False),
    }


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tqgguf", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="200"))


# ---- integrity, through the CLI ---------------------------------------------------------------


def _tensor_info_offset(data: bytes, name: str) -> int:
    """Byte offset of the tensor info of `name` (right after its name), located without tqgguf's reader."""
    key = struct.pack("<Q", len(name)) + name.encode()
    pos = data.find(key)
    assert pos > 0
    return pos + len(key)


def _info_fields(data: bytes, name: str) -> tuple[int, int]:
    """(offset of the type u32, offset of the data-offset u64) in the tensor info of `name`."""
    p = _tensor_info_offset(data, name)
    (n_dims,) = struct.unpack_from("<I", data, p)
    type_pos = p + 4 + 8 * n_dims
    return type_pos, type_pos + 4


def assert_diagnosis(path: Path, *words: str) -> str:
    r = run_cli("check", str(path))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr            # one line, no hint needed
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_valid_file_reads_back(models):
    g = read_gguf(models["hd64"])
    assert g.version == 3 and len(g.tensors) == 2 * 2 + 2 and g.alignment == 32
    assert g.tensor_bytes == 96 * 512 * 2 + 2 * (512 * 4 + 128 * 512 * 4) + 512 * 4


@pytest.mark.parametrize("cut", ["2", "10", "kv", "infos", "data-start", "data-middle", "minus1"])
def test_truncated(models, tmp_path, cut):
    data = models["hd64"].read_bytes()
    g = read_gguf(models["hd64"])
    at = {"2": 2, "10": 10, "kv": 60, "infos": _tensor_info_offset(data, "blk.1.attn_k.weight"),
          "data-start": g.data_offset + 8, "data-middle": (g.data_offset + len(data)) // 2,
          "minus1": len(data) - 1}[cut]
    bad = tmp_path / f"cut-{cut}.gguf"
    bad.write_bytes(data[:at])
    if at < 4:
        assert_diagnosis(bad, "not a GGUF file", f"only {at} bytes")
    else:
        assert_diagnosis(bad, "truncated")


def test_flipped_tensor_type_unknown(models, tmp_path):
    data = bytearray(models["hd64"].read_bytes())
    type_pos, _ = _info_fields(data, "blk.0.attn_k.weight")
    assert struct.unpack_from("<I", data, type_pos)[0] == 0       # f32
    struct.pack_into("<I", data, type_pos, 0 ^ (1 << 6))          # one flipped bit: id 64
    bad = tmp_path / "flip.gguf"
    bad.write_bytes(bytes(data))
    assert_diagnosis(bad, "corrupted", "blk.0.attn_k.weight", "unknown type id 64")


def test_flipped_tensor_type_known_but_wrong(models, tmp_path):
    """f32 -> f16: the tensor shrinks, so the next tensor's data no longer starts where this one ends."""
    data = bytearray(models["hd64"].read_bytes())
    type_pos, _ = _info_fields(data, "blk.0.attn_k.weight")
    struct.pack_into("<I", data, type_pos, 1)
    bad = tmp_path / "flip2.gguf"
    bad.write_bytes(bytes(data))
    assert_diagnosis(bad, "corrupted", "blk.1.attn_norm.weight", "expected")


def test_removed_tensor_type(models, tmp_path):
    data = bytearray(models["hd64"].read_bytes())
    type_pos, _ = _info_fields(data, "output_norm.weight")
    struct.pack_into("<I", data, type_pos, 4)
    bad = tmp_path / "q4_2.gguf"
    bad.write_bytes(bytes(data))
    assert_diagnosis(bad, "q4_2", "no longer supports")


def test_tensor_past_the_end(models, tmp_path):
    data = bytearray(models["hd64"].read_bytes())
    _, off_pos = _info_fields(data, "output_norm.weight")
    struct.pack_into("<Q", data, off_pos, 1 << 30)                # aligned, far beyond the file
    bad = tmp_path / "past.gguf"
    bad.write_bytes(bytes(data))
    assert_diagnosis(bad, "output_norm.weight", "past the end of the", f"{len(data)}-byte file")


def test_misaligned_tensor(models, tmp_path):
    data = bytearray(models["hd64"].read_bytes())
    _, off_pos = _info_fields(data, "output_norm.weight")
    (off,) = struct.unpack_from("<Q", data, off_pos)
    struct.pack_into("<Q", data, off_pos, off - 4)
    bad = tmp_path / "misaligned.gguf"
    bad.write_bytes(bytes(data))
    assert_diagnosis(bad, "not aligned to 32 bytes")


def test_non_gguf_files(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello, I am not a model\n" * 10)
    assert_diagnosis(text, "not a GGUF file", "b'hell'")
    st = tmp_path / "model.safetensors"
    st.write_bytes(struct.pack("<Q", 2) + b"{}")
    assert_diagnosis(st, "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_diagnosis(empty, "only 0 bytes")
    assert_diagnosis(tmp_path / "missing.gguf", "no such file")
    assert_diagnosis(tmp_path, "not a regular file")


def test_bad_header_fields(models, tmp_path):
    data = bytearray(models["hd64"].read_bytes())
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(bytes(data[:4]) + struct.pack("<I", 1) + bytes(data[8:]))
    assert_diagnosis(v1, "version 1")
    be = tmp_path / "be.gguf"
    be.write_bytes(bytes(data[:4]) + struct.pack(">I", 3) + bytes(data[8:]))
    assert_diagnosis(be, "big-endian")
    huge = tmp_path / "count.gguf"
    huge.write_bytes(bytes(data[:8]) + struct.pack("<Q", 1 << 40) + bytes(data[16:]))
    assert_diagnosis(huge, "corrupted", "tensors")


def test_missing_required_metadata(tmp_path):
    w = GGUFWriter(str(tmp_path / "nometa.gguf"), "llama")
    w.add_block_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("x.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_diagnosis(tmp_path / "nometa.gguf", "llama.embedding_length", "missing")


def test_missing_arch_specific_metadata(models):
    """llama.cpp's llama loader requires llama.attention.layer_norm_rms_epsilon (data/arch_required.json)."""
    assert_diagnosis(models["no-eps"], "llama.attention.layer_norm_rms_epsilon", "missing")


def test_json_error_report(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x00" * 5)
    r = run_cli("check", str(p), "--json")
    assert r.returncode == 2
    rep = json.loads(r.stdout)
    assert rep["exit_code"] == 2 and rep["file"]["integrity"] == "error" and "truncated" in rep["error"]


# ---- shape facts ---------------------------------------------------------------------------------


def test_facts_plain_and_gqa(models):
    _, f = load_facts(models["gqa8"])
    assert f.arch == "llama" and f.arch_known and f.swa_type == "none" and not f.mla
    assert [ly.index for ly in f.kv_layers] == [0, 1]
    assert {(ly.n_head, ly.n_head_kv, ly.head_dim_k, ly.head_dim_v) for ly in f.layers} == {(16, 2, 128, 128)}
    assert f.gqa_ratio == 8
    _, f = load_facts(models["hd64"])
    assert {ly.head_dim_k for ly in f.layers} == {64}                # n_embd / n_head without key_length


def test_facts_sliding_window_from_file(models):
    _, f = load_facts(models["swa"])
    assert f.swa_type == "standard" and f.n_swa == 512
    assert [ly.index for ly in f.kv_layers if ly.swa] == [0, 1, 3, 4]


def test_facts_gemma3_default_pattern(models):
    """No pattern in the file: llama.cpp's gemma3 default is 5 sliding : 1 full (load_swa_pattern(ml, 6))."""
    _, f = load_facts(models["gemma3-default"])
    assert f.n_swa == 1024
    assert [ly.index for ly in f.layers if not ly.swa] == [5, 11]


def test_facts_unknown_and_recurrent_arch(models):
    _, f = load_facts(models["unknown"])
    assert not f.arch_known and "not in tqgguf's table" in f.notes[0]
    assert len(f.kv_layers) == 2
    _, f = load_facts(models["mamba"])
    assert f.memory == "recurrent" and f.kv_layers == []


def test_facts_smollm2():
    from tqgguf.models import smollm2_path

    _, f = load_facts(smollm2_path())
    assert (f.arch, f.n_layer, f.n_embd, f.n_vocab, f.n_ctx_train) == ("llama", 30, 576, 49152, 8192)
    assert {(ly.n_head, ly.n_head_kv, ly.head_dim_k) for ly in f.kv_layers} == {(9, 3, 64)}
    assert len(f.kv_layers) == 30 and f.gqa_ratio == 3


# ---- verdicts --------------------------------------------------------------------------------------


def test_verdicts(models):
    _, hd64 = load_facts(models["hd64"])
    _, hd96 = load_facts(models["hd96"])
    _, hd80 = load_facts(models["hd80"])
    for t in ("turbo2", "turbo3", "turbo4", "q8_0", "q4_0", "f16"):
        assert kvcompat.verdict(hd64, "K", t).status == "native"
    v = kvcompat.verdict(hd96, "V", "turbo3")
    assert (v.status, v.effective) == ("falls back", "q8_0") and "96" in v.reason
    assert kvcompat.verdict(hd96, "K", "q4_0").status == "native"
    v = kvcompat.verdict(hd80, "K", "turbo4")
    assert (v.status, v.effective) == ("falls back", "f16")
    assert kvcompat.verdict(hd80, "K", "q8_0").status == "unsupported"
    assert kvcompat.verdict(hd64, "K", "turbo4", flash_attn=False).status == "unsupported"
    assert kvcompat.verdict(hd64, "V", "q8_0", flash_attn=False).status == "unsupported"
    assert kvcompat.verdict(hd64, "K", "q8_0", flash_attn=False).status == "native"
    assert kvcompat.config_effective(hd96, "q8_0", "turbo2") == ("q8_0", "q8_0", None)
    assert kvcompat.config_effective(hd80, "q8_0", "f16")[2] is not None


def test_variable_kv_heads_and_no_flash_attention(models):
    """Per-layer head_count_kv (0: no attention in that layer); without flash attention V rows are padded."""
    _, f = load_facts(models["varkv"])
    assert [(ly.index, ly.n_head_kv) for ly in f.kv_layers] == [(0, 8), (1, 2)]
    assert kvcompat.verdict(f, "V", "f16", flash_attn=False).status == "padded"
    assert kvcompat.verdict(f, "V", "f16").status == "native"
    fa = kvmem.kv_size(f, kvmem.Runtime(ctx=256), "f16", "f16")
    nofa = kvmem.kv_size(f, kvmem.Runtime(ctx=256, flash_attn=False), "f16", "f16")
    assert fa.v_bytes == (8 + 2) * 64 * 256 * 2 and nofa.v_bytes == 2 * 8 * 64 * 256 * 2
    assert fa.k_bytes == nofa.k_bytes == fa.v_bytes


# ---- memory model on hand-computed cases ----------------------------------------------------------


def test_memory_plain(models):
    _, f = load_facts(models["hd64"])        # 2 layers x 2 kv heads x 64 = 256 values per token per layer pair
    rt = kvmem.Runtime(ctx=1000, n_seq=4, unified=True)
    s = kvmem.kv_size(f, rt, "f16", "turbo3")
    assert [(c.cells, c.streams, c.layers) for c in s.caches] == [(1024, 1, 2)]
    assert s.k_bytes == 2 * 128 * 1024 * 2
    assert s.v_bytes == 2 * (128 // 64) * 26 * 1024
    rt = kvmem.Runtime(ctx=1000, n_seq=3, unified=False)   # PAD(1024 / 3 = 341, 256) = 512 cells per stream
    s = kvmem.kv_size(f, rt, "q8_0", "q8_0")
    assert [(c.cells, c.streams) for c in s.caches] == [(512, 3)]
    assert s.k_bytes == s.v_bytes == 2 * (128 // 32) * 34 * 512 * 3


def test_memory_sliding_window(models):
    _, f = load_facts(models["swa"])          # 2 full + 4 sliding layers, 2 kv heads x 128, n_swa 512
    uni = kvmem.kv_size(f, kvmem.Runtime(ctx=8192, n_seq=4, unified=True), "f16", "f16")
    assert [(c.name, c.cells, c.streams, c.layers) for c in uni.caches] == \
        [("base", 8192, 1, 2), ("swa", 2560, 1, 4)]            # PAD(min(8192, 512 * 4 + 512), 256)
    per = kvmem.kv_size(f, kvmem.Runtime(ctx=8192, n_seq=4, unified=False, n_ubatch=100), "f16", "f16")
    assert [(c.cells, c.streams) for c in per.caches] == [(2048, 4), (768, 4)]   # PAD(512 + 100)
    small = kvmem.kv_size(f, kvmem.Runtime(ctx=300, n_seq=1), "f16", "f16")
    assert [c.cells for c in small.caches] == [512, 512]       # min(cells, ...) then PAD
    full = kvmem.kv_size(f, kvmem.Runtime(ctx=8192, n_seq=4, swa_full=True), "f16", "f16")
    assert [c.cells for c in full.caches] == [8192, 8192]
    assert uni.k_bytes == 256 * 2 * (2 * 8192 + 4 * 2560)


def test_bits_per_value_and_ratio_to_f16(models):
    _, f = load_facts(models["gqa8"])
    rt = kvmem.Runtime(ctx=4096)
    f16 = kvmem.kv_size(f, rt, "f16", "f16")
    for cfg, bpv in {"turbo4": 4.25, "turbo3": 3.25, "turbo2": 2.25, "q8_0": 8.5, "q4_0": 4.5}.items():
        s = kvmem.kv_size(f, rt, cfg, cfg)
        assert s.bits_per_value == pytest.approx(bpv)
        assert f16.total / s.total == pytest.approx(16 / bpv)
    s = kvmem.kv_size(f, rt, "turbo4", "turbo2")
    assert f16.total / s.total == pytest.approx(32 / 6.5) and round(f16.total / s.total, 1) == 4.9


# ---- fit and recommendation ------------------------------------------------------------------------


def test_fit_largest_context(models):
    _, f = load_facts(models["gqa8"])
    budget = f.weights_bytes + 700 * MIB
    base = kvmem.Runtime(ctx=4096, n_seq=1)
    fits = {c: kvmem.fit(f, base, c, c, budget, "ctx") for c in ("f16", "q8_0", "turbo4", "turbo2")}
    for c, r in fits.items():
        assert r.need <= budget and r.value % 256 == 0
        if r.capped:
            assert r.value == f.n_ctx_train
        else:
            nxt = kvmem.Runtime(ctx=r.value + 256, n_seq=1)
            over = f.weights_bytes + kvmem.kv_size(f, nxt, c, c).total + kvmem.compute_margin(f, nxt)
            assert over > budget, c
    assert 0 < fits["f16"].value < fits["q8_0"].value < fits["turbo4"].value < fits["turbo2"].value < 262144
    assert kvmem.fit(f, base, "f16", "f16", f.weights_bytes, "ctx").value == 0


def test_fit_slots(models):
    _, f = load_facts(models["gqa8"])
    base = kvmem.Runtime(ctx=2048, n_seq=1, unified=True)
    budget = f.weights_bytes + 1024 * MIB
    r16 = kvmem.fit(f, base, "f16", "f16", budget, "slots")
    r2 = kvmem.fit(f, base, "turbo2", "turbo2", budget, "slots")
    assert 1 <= r16.value < r2.value
    rt = kvmem.Runtime(ctx=2048 * r16.value, n_seq=r16.value, unified=True)
    assert f.weights_bytes + kvmem.kv_size(f, rt, "f16", "f16").total + kvmem.compute_margin(f, rt) <= budget


def test_recommendation_rules(models):
    _, gqa8 = load_facts(models["gqa8"])
    a = advice.recommend(gqa8)
    assert (a.config, a.rule) == ("q8_0/turbo3", "high-gqa") and "8:1" in a.reason
    _, hd96 = load_facts(models["hd96"])
    assert advice.recommend(hd96).config == "q8_0/q4_0"
    _, hd80 = load_facts(models["hd80"])
    assert advice.recommend(hd80).rule == "turbo-falls-back-f16"
    _, hd64 = load_facts(models["hd64"])
    a = advice.recommend(hd64)
    assert (a.config, a.rule) == ("q8_0/turbo4", "default")
    _, mamba = load_facts(models["mamba"])
    assert advice.recommend(mamba).config is None
    assert advice.recommend(hd64, flash_attn=False).config == "q8_0/f16"


def test_recommendation_follows_the_budget(models):
    _, f = load_facts(models["hd64"])
    rt = kvmem.Runtime(ctx=4096, n_seq=1)

    def fits_under(budget):
        def fits(cfg):
            k, v = advice.split(cfg)
            return kvmem.kv_size(f, rt, k, v).total <= budget
        return fits
    turbo2_v = kvmem.kv_size(f, rt, "turbo3", "turbo2").total
    a = advice.recommend(f, fits=fits_under(turbo2_v))
    assert a.config == "turbo3/turbo2" and a.rule == "fit"
    assert any("boundary-layer protection" in n for n in a.notes)
    a = advice.recommend(f, fits=fits_under(kvmem.kv_size(f, rt, "turbo4", "turbo4").total))
    assert a.config == "turbo4" and "q8_0/turbo4 does not fit" in a.reason
    assert not any("boundary" in n for n in a.notes)
    assert not any("boundary" in n for n in advice.recommend(f).notes)
    assert advice.recommend(f, fits=fits_under(0)).rule == "fit-none"


def test_rules_are_data():
    r = advice.rules()
    assert r["rules"][-1]["when"] == {} and all("id" in x and "reason" in x for x in r["rules"])
    for order in r["quality_order"].values():
        for cfg in order:
            for t in advice.split(cfg):
                assert t in kvcompat.REPORT_TYPES or t in ("f16",)


# ---- the command -----------------------------------------------------------------------------------


def test_cli_check_text_and_json(models):
    r = run_cli("check", str(models["gqa8"]), "--ctx", "4096", "--parallel", "1", "--mem", "1GiB")
    assert r.returncode == 0, r.stderr
    assert "file OK" in r.stdout and "GQA 8:1" in r.stdout and "turbo4/turbo2" in r.stdout
    assert "4.9x smaller" in r.stdout and "-ctk q8_0 -ctv turbo3" in r.stdout and "largest -c" in r.stdout
    j = run_cli("check", str(models["gqa8"]), "--ctx", "4096", "--parallel", "1", "--mem", "1GiB", "--json")
    rep = json.loads(j.stdout)
    assert j.returncode == rep["exit_code"] == 0
    rows = {row["config"]: row for row in rep["memory"]}
    assert rows["f16"]["total_mib"] == 2 * 2 * 256 * 4096 * 2 / MIB
    assert rep["recommendation"]["k"] == "q8_0" and rep["fit"]["results"]


def test_cli_check_warnings_exit_1(models):
    r = run_cli("check", str(models["hd96"]), "--ctx", "2048")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "falls back" in r.stdout and "runs as q8_0/q8_0" in r.stdout
    r = run_cli("check", str(models["unknown"]), "--ctx", "2048", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and any("not in tqgguf's table" in w for w in rep["warnings"])


def test_cli_check_bad_options(models):
    for args, word in ((["--mem", "lots"], "--mem"), (["--config", "q9_9"], "unknown K cache type"),
                       (["--parallel", "0"], "--parallel"), (["--fit", "tokens"], "--fit")):
        r = run_cli("check", str(models["hd64"]), *args)
        assert r.returncode == 2 and word in r.stderr and "Traceback" not in r.stderr


def test_cli_check_gpu_reads_nvidia_smi(models, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 140000, 143771'\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="0")
    r = subprocess.run([sys.executable, "-m", "tqgguf", "check", str(models["hd64"]), "--gpu", "--json"],
                       capture_output=True, text=True, env=env)
    rep = json.loads(r.stdout)
    assert rep["fit"]["budget_mib"] == 140000 and "H200" in rep["fit"]["source"]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    r = subprocess.run([sys.executable, "-m", "tqgguf", "check", str(models["hd64"]), "--gpu"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "nvidia-smi" in r.stderr and "Traceback" not in r.stderr


def test_parse_size():
    assert parse_size("24GiB") == 24 << 30 and parse_size("1.5 G") == 3 << 29 and parse_size("800MiB") == 800 << 20
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("-1G")


def test_report_api(models):
    rep = build_report(models["swa"], CheckOptions(ctx=8192, parallel=4))
    assert rep["facts"]["swa_layers"] == [0, 1, 3, 4] and rep["runtime"]["cells_per_stream"] == 8192
    with pytest.raises(GgufError):
        build_report(models["swa"].parent / "nope.gguf", CheckOptions())


def test_required_keys_table_matches_the_pinned_source(llama_source):
    script = Path(__file__).resolve().parent.parent / "scripts" / "gen_arch_required.py"
    r = subprocess.run([sys.executable, str(script), str(llama_source), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
