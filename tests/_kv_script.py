"""Run inside a fresh Python with the tqgguf-bound llama_cpp on PYTHONPATH (see test_turbo_llama.py).

usage: _kv_script.py shift|state MODEL TEXT TYPE_K TYPE_V OUT.npy
  shift: fill a 256-token context, discard 128 tokens with a K-shift (llama_memory_seq_rm/_add), then
         teacher-force the next 64 tokens; saves their logits.
  state: evaluate 100 tokens, save the session state, evaluate 8 more; load the state into a fresh
         context and evaluate the same 8; saves both logit arrays stacked.
"""

import sys

import numpy as np

import llama_cpp as L

mode, model, text, tk, tv, out = sys.argv[1:7]
types = {"f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0,
         "turbo2": L.GGML_TYPE_TURBO2_0, "turbo3": L.GGML_TYPE_TURBO3_0, "turbo4": L.GGML_TYPE_TURBO4_0}


def make(n_ctx):
    return L.Llama(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2, logits_all=True, verbose=False,
                   type_k=types[tk], type_v=types[tv], flash_attn=True, seed=1)


raw = open(text, encoding="utf-8").read()[:20000]
llm = make(256)
toks = llm.tokenize(raw.encode(), add_bos=True)
assert len(toks) >= 400, len(toks)

if mode == "shift":
    llm.eval(toks[:256])
    n_keep, n_discard = 16, 128
    mem = L.llama_get_memory(llm._ctx.ctx)
    assert L.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
    L.llama_memory_seq_add(mem, 0, n_keep + n_discard, -1, -n_discard)
    llm.n_tokens -= n_discard
    start = llm.n_tokens
    llm.eval(toks[256:320])
    np.save(out, np.array(llm.scores[start:start + 64], dtype=np.float32))
elif mode == "state":
    llm.eval(toks[:100])
    st = llm.save_state()
    llm.eval(toks[100:108])
    a = np.array(llm.scores[100:108], dtype=np.float32)
    fresh = make(256)
    fresh.load_state(st)
    fresh.eval(toks[100:108])
    b = np.array(fresh.scores[100:108], dtype=np.float32)
    np.save(out, np.stack([a, b]))
else:
    sys.exit(f"unknown mode {mode}")
print("done")
