"""`tqgguf serve` against the real patched llama-server on the CPU with SmolLM2-135M: the effective configuration
it verifies, chat, concurrent clients, and every way a launch can go wrong. Only 127.0.0.1 is used; every wait is
bounded, and each test checks that no llama-server it started is left behind."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tqgguf.client import Client, ServerError, parse_metrics

pytestmark = pytest.mark.build

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180


@pytest.fixture(scope="module")
def smol() -> Path:
    from tqgguf.models import smollm2_path

    return smollm2_path()


@pytest.fixture(scope="module")
def env(llama_bin, tmp_path_factory) -> dict:
    e = dict(os.environ, TQGGUF_BIN_DIR=str(llama_bin("llama-server").parent),
             TQGGUF_CACHE=str(tmp_path_factory.mktemp("cache")), NO_COLOR="1", COLUMNS="200")
    e.pop("TQGGUF_API_KEY", None)
    return e


def _procs_with(marker: str) -> list[int]:
    """pids of running processes whose command line contains marker."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if marker in cmd and "llama-server" in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


class Serve:
    """`tqgguf serve --json` in a subprocess: the JSON line it prints when ready, then a stop by signal.

    llama-server runs with one thread: on a small shared CI machine, two threads that wait for each other at every
    graph barrier while other processes hold the cores make generation hundreds of times slower."""

    def __init__(self, args: list[str], env: dict, timeout: float = START_TIMEOUT):
        self.marker = f"tq-{uuid.uuid4().hex[:10]}"   # the model alias: finds the server in /proc
        cmd = [sys.executable, "-m", "tqgguf", "serve", *args, "--json", "--", "-t", "1", "-a", self.marker]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.info: dict | None = None
        self.stderr = ""
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if sel.select(timeout=0.5):
                line = self.proc.stdout.readline()
                if line.strip():
                    self.info = json.loads(line)
                    break
        sel.close()
        if self.info is None:
            self.finish(signal.SIGTERM)
            pytest.fail(f"tqgguf serve was not ready (exit {self.proc.returncode}): {self.stderr[-3000:]}")

    @property
    def url(self) -> str:
        return self.info["url"]

    @property
    def server_pid(self) -> int:
        return self.info["pid"]

    def finish(self, sig: int | None = signal.SIGTERM, timeout: float = 60) -> int:
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate(timeout=10)
            pytest.fail("tqgguf serve did not stop in time")
        return self.proc.returncode


def _run(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tqgguf", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errs = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 1, stderr
    return errs[0]


# ---- one server: turbo4/turbo2 with the default boundary policy, 4 slots --------------------------------------


@pytest.fixture(scope="module")
def served(smol, env):
    s = Serve(["-m", str(smol), "--cache-type-k", "turbo4", "--cache-type-v", "turbo2", "-c", "2048",
               "--parallel", "4", "--port", "auto"], env)
    try:
        yield s
    finally:
        code = s.finish(signal.SIGTERM)
        gone = _wait_gone(s.server_pid)
        assert code == 0, s.stderr[-2000:]
        assert gone and not _procs_with(s.marker), "llama-server left running after SIGTERM"


def test_effective_config_equals_the_request(served):
    info = served.info
    eff = info["effective"]
    assert info["deviations"] == [], info["deviations"]
    assert info["requested"]["boundary_v"] == 2 and info["requested"]["boundary_v_type"] == "q8_0"
    assert eff["k"] == "turbo4" and eff["v"] == "turbo2"
    assert eff["boundary_layers"] == [0, 1, 28, 29] and eff["boundary_type"] == "q8_0"
    assert eff["v_types"] == "2-27:turbo2 0-1,28-29:q8_0"
    assert eff["flash_attn"] is True
    assert eff["attention_layers"] == 30 and eff["attention_on_layer_device"] == 30 and eff["attention_moved"] == []
    assert eff["slots"] == 4 and eff["n_ctx"] == 2048
    assert Path(info["log"]).is_file()
    assert info["url"].startswith("http://127.0.0.1:")


def test_kv_size_matches_tqgguf_check(served, smol, env):
    """The KV size llama.cpp logs equals `tqgguf check`'s turbo4/turbo2 estimate plus the 4 boundary layers' V
    at q8_0 instead of turbo2."""
    from tqgguf import ggml_types

    eff = served.info["effective"]
    cache = eff["caches"][0]
    r = _run(["check", str(smol), "--ctx", "2048", "--parallel", str(cache["seqs"]),
              "--unified" if cache["streams"] == 1 else "--no-unified", "--config", "turbo4/turbo2", "--json"], env)
    assert r.returncode in (0, 1), r.stderr
    row = next(c for c in json.loads(r.stdout)["memory"] if c["config"] == "turbo4/turbo2")
    assert row["caches"][0]["cells"] == cache["cells"] and row["caches"][0]["streams"] == cache["streams"]
    v_values = 3 * 64  # SmolLM2: 3 KV heads of 64
    q8, t2 = ggml_types.cache_type("q8_0"), ggml_types.cache_type("turbo2")
    extra = 4 * (q8.row_bytes(v_values) - t2.row_bytes(v_values)) * cache["cells"] * cache["streams"]
    mib = 2**20
    # llama.cpp logs MiB with 2 decimals
    assert eff["k_mib"] == pytest.approx(row["k_bytes"] / mib, abs=0.006)
    assert eff["v_mib"] == pytest.approx((row["v_bytes"] + extra) / mib, abs=0.006)
    assert eff["kv_mib"] == pytest.approx((row["k_bytes"] + row["v_bytes"] + extra) / mib, abs=0.006)
    assert served.info["kv_estimate"]["total_mib"] == pytest.approx(eff["kv_mib"], abs=0.011)


def test_chat_at_temperature_0_is_sensible(served):
    with Client(served.url, timeout=120) as c:
        a = c.chat_text("What is the capital of France?", max_tokens=24, temperature=0.0)
        b = c.chat_text("What is the capital of France?", max_tokens=24, temperature=0.0)
        assert a == b, (a, b)  # greedy: the same answer twice
        assert "Paris" in a, a
        r = c.completion("The first three months of the year are January, February and", n_predict=4)
        assert "March" in r["content"], r["content"]
        props = c.props()
        assert props["total_slots"] == 4
        m = c.metrics()
        assert m.get("llamacpp:prompt_tokens_total", 0) > 0, sorted(m)[:20]


def test_four_concurrent_clients(served):
    """--parallel 4: four clients, 20 requests each with prompts of different lengths; all complete, none errors,
    and the server is still healthy."""
    words = "the river flows past the old mill and the town where the market opens every morning".split()
    errors: list[str] = []
    done: list[int] = []

    def client(i: int) -> None:
        with Client(served.url, timeout=120) as c:
            for j in range(20):
                n = 3 + (7 * i + 13 * j) % 40
                prompt = " ".join(words[(i + k) % len(words)] for k in range(n))
                try:
                    r = c.completion(prompt, n_predict=2 + j % 3, temperature=0.0)
                    if not isinstance(r.get("content"), str) or r.get("tokens_predicted", 0) < 1:
                        errors.append(f"client {i} request {j}: {str(r)[:200]}")
                    else:
                        done.append(1)
                except ServerError as e:
                    errors.append(f"client {i} request {j}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "clients did not finish in time"
    assert not errors, errors[:5]
    assert len(done) == 80
    with Client(served.url) as c:
        assert c.health()[0] == 200
        m = c.metrics()
        assert m.get("llamacpp:requests_processing", 0) == 0


# ---- bad input: one line, a non-zero exit, nothing left running ---------------------------------------------


def test_missing_model_file(env, tmp_path):
    r = _run(["serve", "-m", str(tmp_path / "nope.gguf"), "--port", "auto"], env)
    assert r.returncode == 2
    assert "model file not found" in _one_error_line(r.stderr)


def test_unknown_cache_type(smol, env):
    r = _run(["serve", "-m", str(smol), "--cache-type-v", "turbo5", "--port", "auto"], env)
    assert r.returncode == 2
    assert "unknown cache type 'turbo5'" in _one_error_line(r.stderr)


@pytest.mark.parametrize("fa", [["-fa", "off"], ["--flash-attn", "off"], ["--"]])
def test_incompatible_request(fa, smol, env):
    """turbo types need flash attention: asking for it to be off (serve's own -fa, or llama-server's after --)
    cannot work."""
    marker = f"tq-{uuid.uuid4().hex[:10]}"
    after = ["-fa", "off"] if fa == ["--"] else []
    r = _run(["serve", "-m", str(smol), "-ctk", "turbo4", "-ctv", "turbo2", "--port", "auto", *fa, *after,
              *([] if fa == ["--"] else ["--"]), "-a", marker], env)
    assert r.returncode == 2
    line = _one_error_line(r.stderr)
    assert "cannot work" in line and "flash attention" in line, line
    assert not _procs_with(marker)


def test_not_a_gguf(env, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    r = _run(["serve", "-m", str(bad), "--port", "auto"], env)
    assert r.returncode == 2
    assert str(bad) in _one_error_line(r.stderr)


def test_port_already_taken(smol, env):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        marker = f"tq-{uuid.uuid4().hex[:10]}"
        r = _run(["serve", "-m", str(smol), "--port", str(port), "--", "-a", marker], env)
    assert r.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in _one_error_line(r.stderr)
    assert not _procs_with(marker)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_non_loopback_host_needs_an_api_key(host, smol, env):
    r = _run(["serve", "-m", str(smol), "--host", host, "--port", "auto"], env)
    assert r.returncode == 2
    assert "--api-key" in _one_error_line(r.stderr)


def test_api_key_is_required_by_the_server(smol, env):
    """With --api-key the server rejects requests without it (the key goes by environment, not on the command
    line)."""
    s = Serve(["-m", str(smol), "-c", "512", "--port", "auto", "--api-key", "sekret-123"], env)
    try:
        assert not any("sekret-123" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
                       for pid in _procs_with(s.marker))
        with pytest.raises(ServerError) as e:
            Client(s.url).props()
        assert e.value.status == 401
        assert Client(s.url, api_key="sekret-123").props()["total_slots"] >= 1
    finally:
        assert s.finish(signal.SIGINT) == 0, s.stderr[-2000:]
        assert _wait_gone(s.server_pid) and not _procs_with(s.marker)


def test_server_killed_mid_run(smol, env):
    s = Serve(["-m", str(smol), "-c", "512", "--port", "auto"], env)
    pid = s.server_pid
    assert _alive(pid)
    os.kill(pid, signal.SIGKILL)
    code = s.finish(sig=None, timeout=30)
    assert code == 1, s.stderr
    line = _one_error_line(s.stderr)
    assert "llama-server died (killed by SIGKILL)" in line, line
    assert "log:" in s.stderr  # the hint names the log file, whose last lines were printed
    assert _wait_gone(pid) and not _procs_with(s.marker)


def test_a_different_effective_config_fails_after_launch(smol, env):
    """A llama-server flag after -- that changes the V types tqgguf asked for (here every layer's, by the series'
    --cache-type-v-layers): the log shows it, and serve stops the server and exits 1."""
    marker = f"tq-{uuid.uuid4().hex[:10]}"
    r = _run(["serve", "-m", str(smol), "-ctk", "turbo4", "-ctv", "turbo2", "-c", "512", "--port", "auto", "--",
              "--cache-type-v-layers", "0-29:q8_0", "-t", "1", "-a", marker], env, timeout=START_TIMEOUT)
    assert r.returncode == 1, r.stderr
    line = _one_error_line(r.stderr)
    assert "not running what was requested" in line and "is q8_0 (requested turbo2)" in line, line
    assert not _procs_with(marker)



@pytest.mark.parametrize("args,flag,ours", [
    (["serve", "--", "-ctv", "q8_0"], "-ctv", "-ctv"),
    (["serve", "--", "--cache-type-k=q8_0"], "--cache-type-k", "-ctk"),
    (["serve", "--", "-lv", "1"], "-lv", None),
    (["serve", "--", "--port", "9999"], "--port", "--port"),
    (["ppl", "-f", __file__, "--", "-c", "128"], "-c", "-c"),
    (["bench", "--", "-d", "1024"], "-d", "--depth"),
    (["bench", "--batched", "--", "-npl", "4"], "-npl", "--npl"),
    (["niah", "--", "-ngl", "0"], "-ngl", "-ngl"),
])
def test_flags_tqgguf_sets_are_refused_after_the_separator(args, flag, ours, smol, tmp_path):
    """After --, a flag tqgguf passes itself would be overridden silently (the tools take the later one) or would
    hide what tqgguf reads from the log: refused before anything runs, naming tqgguf's own option."""
    env = dict(os.environ, TQGGUF_CACHE=str(tmp_path), NO_COLOR="1", COLUMNS="200")
    cmd, rest = args[0], args[1:]
    r = subprocess.run([sys.executable, "-m", "tqgguf", cmd, "-m", str(smol), *rest], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"{flag} after -- would override what tqgguf {cmd} passes" in r.stderr and "Traceback" not in r.stderr
    assert (f"use tqgguf's {ours} instead" if ours else "leave it out") in r.stderr

def test_fallback_is_refused_unless_allowed(llama_source, env, tmp_path):
    """Head dim 96: turbo3 falls back to q8_0. Refused before launch; with --allow-fallback the server runs and
    the fallback is reported loudly."""
    from tqgguf.synth import SynthShape, find_vocab, synth

    model = tmp_path / "hd96.gguf"
    synth(model, SynthShape(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=96, n_ff=512, n_ctx_train=4096),
          find_vocab(llama_source), weights="q8_0")
    r = _run(["serve", "-m", str(model), "-ctk", "turbo3", "-ctv", "turbo3", "--port", "auto"], env)
    assert r.returncode == 2
    assert "would use K q8_0 / V q8_0" in _one_error_line(r.stderr)

    s = Serve(["-m", str(model), "-ctk", "turbo3", "-ctv", "turbo3", "-c", "256", "--port", "auto",
               "--allow-fallback"], env)
    try:
        eff = s.info["effective"]
        assert eff["k"] == "q8_0" and eff["v"] == "q8_0"
        assert "K cache is q8_0, requested turbo3" in s.info["deviations"]
        assert len(eff["fallbacks"]) == 2, eff["fallbacks"]
    finally:
        assert s.finish(signal.SIGTERM) == 0
        assert _wait_gone(s.server_pid) and not _procs_with(s.marker)
    assert "FALLBACK: K cache is q8_0, requested turbo3" in s.stderr


def test_policy_presets_are_measured_data():
    from tqgguf.serve import load_policies

    policies = load_policies()
    assert set(policies) == {"quality", "balanced", "compact"}
    for p in policies.values():
        m = p.measured
        assert m["model"] and m["kld"] > 0 and m["kld_err"] > 0 and m["chunks"] >= 1 and m["kv_bits_per_value"] > 0, p
    # ordered by quality and by size
    q, b, c = policies["quality"], policies["balanced"], policies["compact"]
    assert q.measured["kld"] < b.measured["kld"] < c.measured["kld"]
    assert q.measured["kv_bits_per_value"] > b.measured["kv_bits_per_value"] > c.measured["kv_bits_per_value"]


def test_parse_metrics():
    text = "# HELP x\nllamacpp:prompt_tokens_total 12\nllamacpp:tokens{slot=\"0\"} 3.5\nbad line\n"
    assert parse_metrics(text) == {"llamacpp:prompt_tokens_total": 12.0, 'llamacpp:tokens{slot="0"}': 3.5}


def test_effective_v_is_the_type_between_the_boundary_layers():
    """8 layers with 2 boundary layers at each end: 4 q8_0 and 4 turbo3 layers. `tqgguf serve --json` names turbo3
    as the V type (the one requested), not the boundary's q8_0 (as the most frequent type, a tie, did on an H100)."""
    from tqgguf.serve import parse_server_log

    log = ("llama_resolve_v_layer_types: V boundary layers: 0,1,6,7 (2 from each end of 8 KV layers, q8_0)\n"
           "llama_kv_cache: size =   57.50 MiB (  8192 cells,   8 layers,  4/1 seqs), K (q8_0):   34.00 MiB, "
           "V (q8_0):   23.50 MiB (mixed V types)\n"
           "llama_kv_cache: V types: 0-1,6-7:q8_0 2-5:turbo3\n")
    e = parse_server_log(log)
    assert e.v == "turbo3" and e.k == "q8_0" and e.boundary_layers == [0, 1, 6, 7] and e.boundary_type == "q8_0"
    assert e.v_layers == {0: "q8_0", 1: "q8_0", 6: "q8_0", 7: "q8_0", 2: "turbo3", 3: "turbo3", 4: "turbo3",
                          5: "turbo3"}
    # a build that logs no per-layer types: the size line's V type
    assert parse_server_log(log.split("llama_kv_cache: V types")[0]).v == "q8_0"
