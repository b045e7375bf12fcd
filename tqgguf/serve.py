"""`tqgguf serve`: run the patched llama-server with asymmetric K/V cache types and the boundary-layer V policy,
check the request before launch, verify what llama.cpp actually used from its log, and supervise the process.

The boundary-layer V policy (patch "llama: boundary-layer V cache types") keeps the V cache of the first and last N
KV-bearing layers of the model at a higher-precision type (q8_0 by default) when the V type is low (turbo2); it only
ever raises a layer's precision. llama.cpp logs what it used, one line per cache, which `parse_server_log` reads:

    llama_init_from_model_v_layers: V boundary layers: 0,1,28,29 (2 from each end of 30 KV layers, q8_0)
    llama_kv_cache: size =    7.81 MiB (  2048 cells,  30 layers,  4/1 seqs), K (turbo4):    4.15 MiB, V (turbo2):    3.66 MiB (mixed V types)
    llama_kv_cache: V types: 2-27:turbo2 0-1,28-29:q8_0
    resolve_fused_ops: Flash Attention placement: 30 of 30 layer(s) on the layer's device
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from .errors import EXIT_WARN, TqError
from .kvcompat import layer_list as _layer_list
from .runinfo import BIN_DIR_ENV, manifest_of  # noqa: F401 (BIN_DIR_ENV: the variable serve and niah read)

DEFAULT_BOUNDARY_TYPE = "q8_0"
DEFAULT_BOUNDARY_N = 2           # when V is turbo2
POLICIES_FILE = Path(__file__).resolve().parent / "data" / "policies.json"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# ---- policies ---------------------------------------------------------------------------------


@dataclass
class Policy:
    name: str
    k: str
    v: str
    boundary_v: int
    boundary_v_type: str
    summary: str
    measured: dict


def load_policies(path: Path = POLICIES_FILE) -> dict[str, Policy]:
    d = json.loads(path.read_text())
    return {name: Policy(name, p["k"], p["v"], int(p["boundary_v"]), p["boundary_v_type"], p.get("summary", ""),
                         p.get("measured", {}))
            for name, p in d["policies"].items()}


# ---- the request ------------------------------------------------------------------------------


@dataclass
class ServeRequest:
    model: Path
    k: str = "f16"
    v: str = "f16"
    boundary_n: int = 0
    boundary_type: str = DEFAULT_BOUNDARY_TYPE
    policy: str | None = None
    ctx: int | None = None
    parallel: int | None = None
    n_gpu_layers: str | None = None
    host: str = "127.0.0.1"
    port: str = "8080"           # a number or "auto"
    api_key: str | None = None
    extra: list[str] = field(default_factory=list)
    allow_fallback: bool = False
    log_file: Path | None = None
    backends: list[str] = field(default_factory=lambda: ["cpu"])
    startup_timeout: float = 600.0


def make_request(model: Path, k: str | None = None, v: str | None = None, boundary_n: int | None = None,
                 boundary_type: str | None = None, policy: str | None = None, **kw) -> ServeRequest:
    """Explicit flags win over the --policy preset, which wins over the defaults (f16, and a boundary of
    DEFAULT_BOUNDARY_N layers at q8_0 when V is turbo2)."""
    p = None
    if policy is not None:
        policies = load_policies()
        if policy not in policies:
            raise TqError(f"unknown policy {policy!r}", f"choose from {', '.join(policies)}")
        p = policies[policy]
    k = k or (p.k if p else "f16")
    v = v or (p.v if p else "f16")
    if boundary_n is None:
        boundary_n = p.boundary_v if p and v == p.v else (DEFAULT_BOUNDARY_N if v == "turbo2" else 0)
    if boundary_type is None:
        boundary_type = p.boundary_v_type if p else DEFAULT_BOUNDARY_TYPE
    if boundary_n < 0:
        raise TqError(f"--boundary-v must be >= 0, got {boundary_n}")
    return ServeRequest(model=model, k=k, v=v, boundary_n=boundary_n, boundary_type=boundary_type, policy=policy, **kw)


# ---- pre-launch check -------------------------------------------------------------------------


@dataclass
class Plan:
    """What llama.cpp should use for a request, from `tqgguf check`'s model of the pinned llama.cpp."""

    facts: object                     # gguf_check.ModelFacts
    k: str                            # effective K type
    v: str                            # effective V type
    flash_attn: bool
    boundary_type: str | None         # effective boundary type (None: no boundary policy)
    boundary_layers: list[int]        # the first and last N KV-bearing layers
    v_layers: dict[int, str]          # expected V type of every KV layer
    notes: list[str] = field(default_factory=list)


def _flash_attn_from_extra(extra: list[str]) -> bool | None:
    for i, a in enumerate(extra):
        if a in ("-fa", "--flash-attn") and i + 1 < len(extra):
            return extra[i + 1] not in ("off", "0", "false", "disabled")
        if a.startswith("--flash-attn="):
            return a.split("=", 1)[1] not in ("off", "0", "false", "disabled")
    return None


def format_v_types(v_layers: dict[int, str]) -> str:
    """The form llama.cpp logs: '2-27:turbo2 0-1,28-29:q8_0' (the most frequent type first)."""
    groups: dict[str, list[int]] = {}
    for il in sorted(v_layers):
        groups.setdefault(v_layers[il], []).append(il)
    order = sorted(groups, key=lambda t: -len(groups[t]))
    return " ".join(f"{_layer_list(groups[t])}:{t}" for t in order)


def parse_v_types(text: str) -> dict[int, str]:
    """'2-27:turbo2 0-1,28-29:q8_0' -> {layer: type}."""
    out: dict[int, str] = {}
    for group in text.split():
        lst, _, t = group.rpartition(":")
        for item in lst.split(","):
            a, _, b = item.partition("-")
            for il in range(int(a), int(b or a) + 1):
                out[il] = t
    return out


def precheck(req: ServeRequest) -> Plan:
    """The checks of `tqgguf check` for this request: a readable GGUF, known cache types, a K/V pair llama.cpp
    accepts for the model's head dims (no silent fallback unless --allow-fallback), and the boundary layers."""
    from . import ggml_types, kvcompat
    from .gguf_check import load_facts
    from .gguf_read import GgufError

    path = req.model
    if not path.exists():
        raise TqError(f"model file not found: {path}", "give the path of a .gguf file with -m")
    if not path.is_file():
        raise TqError(f"not a file: {path}", "give the path of a .gguf file with -m")
    for what, t in (("--cache-type-k", req.k), ("--cache-type-v", req.v), ("--boundary-v-type", req.boundary_type)):
        try:
            ggml_types.cache_type(t)
        except ValueError:
            raise TqError(f"unknown cache type {t!r} for {what}", f"known: {', '.join(ggml_types.CACHE_TYPES)}") from None
    try:
        _, facts = load_facts(path)
    except GgufError as e:
        raise TqError(f"{path}: {e}", "is it a complete GGUF model? try `tqgguf check` on it") from None
    except OSError as e:
        raise TqError(f"cannot read {path}: {e.strerror or e}") from None

    fa = _flash_attn_from_extra(req.extra)
    fa = True if fa is None else fa
    ek, ev, err = kvcompat.config_effective(facts, req.k, req.v, fa)
    if err:
        raise TqError(f"this request cannot work with {path.name}: {err}", "see `tqgguf check` for what the model supports")
    bv = req.boundary_type if req.boundary_n > 0 else ev  # the boundary layers' V type
    found = kvcompat.gpu_config_error(req.backends, req.n_gpu_layers, ek, (ev, bv))
    if found:
        raise TqError(f"this request cannot run on the GPU: {found[0]}", found[1])
    notes = []
    if (ek, ev) != (req.k, req.v):
        msg = f"llama.cpp would use K {ek} / V {ev} instead of the requested K {req.k} / V {req.v} for {path.name}"
        if not req.allow_fallback:
            raise TqError(msg, "pass --allow-fallback to accept that, or pick types the model supports (`tqgguf check`)")
        notes.append(msg)

    b = kvcompat.boundary_v(facts, ev, req.boundary_n, req.boundary_type, fa)
    if b.error:
        raise TqError(f"boundary type {req.boundary_type} cannot work with {path.name}: {b.error}")
    if b.note:
        notes.append(b.note)
    return Plan(facts, ek, ev, fa, b.type, b.layers, b.v_layers, notes)


def expected_kv(plan: Plan, ctx: int, n_seq: int, unified: bool, swa_full: bool = False) -> dict:
    """`tqgguf check`'s KV estimate (kvmem) for the effective types, with the boundary layers' V at their type."""
    from . import kvmem

    facts = plan.facts
    rt = kvmem.Runtime(ctx=ctx, n_seq=n_seq, unified=unified, flash_attn=plan.flash_attn, swa_full=swa_full)
    size = kvmem.kv_size(facts, rt, plan.k, plan.v, None if facts.mla else plan.v_layers)
    caches = [{"name": c.name, "cells": c.cells, "streams": c.streams, "layers": c.layers, "k_bytes": c.k_bytes,
               "v_bytes": c.v_bytes} for c in size.caches]
    k_bytes = sum(c["k_bytes"] for c in caches)
    v_bytes = sum(c["v_bytes"] for c in caches)
    return {"k_mib": round(k_bytes / kvmem.MIB, 2), "v_mib": round(v_bytes / kvmem.MIB, 2),
            "total_mib": round((k_bytes + v_bytes) / kvmem.MIB, 2), "caches": caches}


# ---- the log ----------------------------------------------------------------------------------

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_SIZE = re.compile(r"llama_kv_cache: size =\s*" + _NUM + r" MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
                   r"K \((\w+)\):\s*" + _NUM + r" MiB, V \((\w+)\):\s*" + _NUM + r" MiB")
_VTYPES = re.compile(r"llama_kv_cache: V types: (.+?)\s*$", re.M)
_BOUNDARY = re.compile(r"V boundary layers: (\S+) \((\d+) from each end of (\d+) KV layers, (\w+)\)")
_FA_STATE = re.compile(r"llama_context: flash_attn\s*=\s*(\w+)")
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported, set to disabled)")
_FA_PLACE = re.compile(r"Flash Attention placement: (\d+) of (\d+) layer\(s\) on the layer's device")
_FA_MOVED = re.compile(r"layer (\d+): Flash Attention with K (\w+), V (\w+) runs on (\S+), not on the layer's device (\S+)")
# ggml-cuda: a quantized K/V pair without a compiled flash-attention kernel is converted to f16 at every call
_FA_CONVERT = re.compile(r"no FlashAttention \w+ kernel compiled for K/V types (\w+)-(\w+), converting K and V to f16")
_FA_MISMATCH = re.compile(r"layer (\d+) is assigned to device (\S+) but Flash Attention is assigned to device (\S+)")
_FALLBACK = re.compile(r"(?:K|V)(?: layer)? (?:cache )?type \w+ needs one head dim[^\n]*using \w+ instead")
_N_CTX = re.compile(r"llama_context: n_ctx\s*=\s*(\d+)")
_SLOTS = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+)")
_LISTEN = re.compile(r"listening on (http://\S+)")


@dataclass
class Effective:
    """What llama.cpp reported in its log."""

    k: str | None = None
    v: str | None = None                                 # the most frequent V type outside the boundary layers
    v_layers: dict[int, str] = field(default_factory=dict)
    flash_attn: bool | None = None
    fa_layers: int | None = None                         # layers with flash attention
    fa_on_device: int | None = None                      # ... of which on the layer's own device
    fa_moved: list[dict] = field(default_factory=list)   # layers whose attention runs elsewhere (no kernel)
    fa_converted: list[dict] = field(default_factory=list)  # K/V pairs the GPU backend converts to f16 (no kernel)
    boundary_layers: list[int] | None = None
    boundary_type: str | None = None
    kv_mib: float | None = None
    k_mib: float | None = None
    v_mib: float | None = None
    caches: list[dict] = field(default_factory=list)
    n_ctx: int | None = None
    slots: int | None = None
    n_ctx_slot: int | None = None
    fallbacks: list[str] = field(default_factory=list)


def parse_server_log(text: str) -> Effective:
    e = Effective()
    for m in _SIZE.finditer(text):
        e.caches.append({"mib": float(m.group(1)), "cells": int(m.group(2)), "layers": int(m.group(3)),
                         "seqs": int(m.group(4)), "streams": int(m.group(5)), "k": m.group(6), "k_mib": float(m.group(7)),
                         "v": m.group(8), "v_mib": float(m.group(9))})
    if e.caches:
        e.k = e.caches[0]["k"]
        e.kv_mib = round(sum(c["mib"] for c in e.caches), 2)
        e.k_mib = round(sum(c["k_mib"] for c in e.caches), 2)
        e.v_mib = round(sum(c["v_mib"] for c in e.caches), 2)
    for m in _VTYPES.finditer(text):
        e.v_layers.update(parse_v_types(m.group(1)))
    if (m := _BOUNDARY.search(text)):
        e.boundary_layers = [] if m.group(1) == "none" else [int(x) for x in m.group(1).split(",")]
        e.boundary_type = m.group(4)
    if e.v_layers:
        # the V type of the layers between the boundary layers (a tie on a short model must not name the boundary's)
        inner = [t for il, t in e.v_layers.items() if il not in (e.boundary_layers or [])] or list(e.v_layers.values())
        counts: dict[str, int] = {}
        for t in inner:
            counts[t] = counts.get(t, 0) + 1
        e.v = max(counts, key=lambda t: counts[t])
    elif e.caches:
        e.v = e.caches[0]["v"]
    if (m := _FA_STATE.search(text)):
        e.flash_attn = {"enabled": True, "disabled": False}.get(m.group(1))
    if (m := _FA_AUTO.search(text)):
        e.flash_attn = m.group(1) == "enabled"
    if (m := _FA_PLACE.search(text)):
        e.fa_on_device, e.fa_layers = int(m.group(1)), int(m.group(2))
    for m in _FA_MOVED.finditer(text):
        e.fa_moved.append({"layer": int(m.group(1)), "k": m.group(2), "v": m.group(3), "runs_on": m.group(4),
                           "layer_device": m.group(5)})
    for m in _FA_CONVERT.finditer(text):
        e.fa_converted.append({"k": m.group(1), "v": m.group(2)})
    for m in _FA_MISMATCH.finditer(text):
        e.fa_moved.append({"layer": int(m.group(1)), "k": None, "v": None, "runs_on": m.group(3),
                           "layer_device": m.group(2)})
    for m in _FALLBACK.finditer(text):
        e.fallbacks.append(m.group(0))
    if (m := _N_CTX.search(text)):
        e.n_ctx = int(m.group(1))
    if (m := _SLOTS.search(text)):
        e.slots, e.n_ctx_slot = int(m.group(1)), int(m.group(2))
    return e


def compare(req: ServeRequest, plan: Plan, eff: Effective) -> list[str]:
    """Every way the effective configuration differs from the request (empty: as requested)."""
    diffs = []
    if plan.facts.kv_layers and eff.k is None:
        return ["llama.cpp did not log its KV cache (log verbosity below 4?): the configuration cannot be verified"]
    if eff.k is not None and eff.k != req.k:
        diffs.append(f"K cache is {eff.k}, requested {req.k}")
    want = {il: t for il, t in plan.v_layers.items()}
    if req.v != plan.v:  # the request itself, not the predicted fallback
        want = {il: (req.v if t == plan.v else t) for il, t in want.items()}
    if eff.v_layers and not plan.facts.mla:
        wrong: dict[str, list[int]] = {}
        for il, t in sorted(want.items()):
            got = eff.v_layers.get(il)
            if got != t:
                wrong.setdefault(f"{got} (requested {t})", []).append(il)
        for what, layers in wrong.items():
            diffs.append(f"V cache of layer(s) {_layer_list(layers)} is {what}")
    elif eff.v is not None and eff.v != req.v and not plan.facts.mla:
        diffs.append(f"V cache is {eff.v}, requested {req.v}")
    if plan.boundary_layers and eff.boundary_layers is not None and eff.boundary_layers != plan.boundary_layers:
        diffs.append(f"llama.cpp chose boundary layers {_layer_list(eff.boundary_layers)}, "
                     f"tqgguf expected {_layer_list(plan.boundary_layers)}")
    if plan.boundary_layers and eff.boundary_layers is None and eff.k is not None:
        diffs.append("llama.cpp did not log boundary layers (a llama-server without the boundary-layer patch?)")
    if plan.flash_attn and eff.flash_attn is False:
        diffs.append("flash attention is off")
    for cv in eff.fa_converted:
        diffs.append(f"flash attention for K {cv['k']} / V {cv['v']} has no kernel on the GPU backend: K and V are "
                     "converted to f16 at every step (slow)")
    for mv in eff.fa_moved:
        pair = f" (K {mv['k']}, V {mv['v']})" if mv["k"] else ""
        diffs.append(f"attention of layer {mv['layer']}{pair} runs on {mv['runs_on']}, not on {mv['layer_device']}: "
                     "no kernel for this K/V pair there, the KV cache is copied every token")
    return diffs


# ---- launching --------------------------------------------------------------------------------


def find_server(backends: list[str] | None = None) -> Path:
    """llama-server of the tqgguf build ($TQGGUF_BIN_DIR, or --bin-dir, overrides the build folder)."""
    from .runinfo import find_tool

    return find_tool("llama-server", backends=backends)


def is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    addrs = {i[4][0] for i in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def _bind_probe(host: str, port: int) -> None:
    """Raise OSError when host:port cannot be bound (in use, or not an address of this machine)."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(info[0], socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(info[4])


def pick_port(host: str, port: str) -> int:
    if port == "auto":
        try:
            info = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
            with socket.socket(info[0], socket.SOCK_STREAM) as s:
                s.bind(info[4])
                return s.getsockname()[1]
        except OSError as e:
            raise TqError(f"cannot bind to {host}: {e.strerror or e}", "check --host") from None
    try:
        p = int(port)
    except ValueError:
        raise TqError(f"--port must be a number or auto, got {port!r}") from None
    if not 1 <= p <= 65535:
        raise TqError(f"--port must be in 1..65535, got {p}")
    try:
        _bind_probe(host, p)
    except OSError as e:
        if e.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise TqError(f"port {p} on {host} is already in use", "pick another --port, or --port auto") from None
        raise TqError(f"cannot bind to {host}:{p}: {e.strerror or e}", "check --host and --port") from None
    return p


def server_args(req: ServeRequest, plan: Plan, port: int) -> list[str]:
    args = ["-m", str(req.model), "--host", req.host, "--port", str(port), "-ctk", req.k, "-ctv", req.v,
            # -lv 4: llama.cpp logs its cache types, sizes and attention placement at this verbosity
            "-lv", "4", "--metrics"]
    if _flash_attn_from_extra(req.extra) is None:
        args += ["-fa", "on"]
    if req.boundary_n > 0:
        args += ["--cache-boundary-layers", str(req.boundary_n), "--cache-type-v-boundary", req.boundary_type]
    if req.ctx is not None:
        args += ["-c", str(req.ctx)]
    if req.parallel is not None:
        args += ["-np", str(req.parallel)]
    if req.n_gpu_layers is not None:
        args += ["-ngl", str(req.n_gpu_layers)]
    return args + list(req.extra)


def default_log_path(model: Path, port: int) -> Path:
    from .paths import cache_dir

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return cache_dir() / "serve" / f"{model.stem}-{stamp}-{port}.log"


def _child_setup() -> None:  # pragma: no cover - runs in the child
    # its own process group (so that stopping it stops everything it started), and SIGTERM when tqgguf dies
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def log_tail(path: Path, n: int = 15) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


class Server:
    """A llama-server process in its own process group, logging to a file."""

    def __init__(self, binary: Path, args: list[str], log_path: Path, api_key: str | None = None):
        self.binary = binary
        self.args = args
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if api_key:
            env["LLAMA_API_KEY"] = api_key  # not on the command line, where `ps` shows it
        self._log = open(log_path, "wb")
        self._log.write(f"# tqgguf serve: {binary} {' '.join(args)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen([str(binary), *args], stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_child_setup if os.name == "posix" else None)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_text(self) -> str:
        rc = self.proc.returncode
        if rc is None:
            return "running"
        if rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exit status {rc}"

    def log_text(self) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after timeout; always reaps the process."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        else:
            try:  # anything it left in its group
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._log.close()


class StopRequest:
    """SIGINT/SIGTERM/SIGHUP set a flag instead of interrupting; the previous handlers come back on exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        for s in STOP_SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    @property
    def requested(self) -> bool:
        return self.signum is not None


@dataclass
class Running:
    """What `serve` reports once the server is ready (--json prints it)."""

    url: str
    pid: int
    log: str
    model: str
    requested: dict
    effective: dict
    kv_estimate: dict | None
    deviations: list[str]
    notes: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


class Ui:
    """How serve talks to the user (the CLI passes rich consoles; tests can pass None)."""

    def __init__(self, status: Callable[[str], object] | None = None, info: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] | None = None):
        self.status = status
        self.info = info or (lambda s: None)
        self.warn = warn or (lambda s: None)


def _dead(server: Server, when: str, ui: Ui | None = None) -> TqError:
    tail = log_tail(server.log_path)
    if ui is not None and tail:
        ui.info(f"last lines of {server.log_path}:")
        for ln in tail:
            ui.info(f"  | {ln}")
    hint = f"log: {server.log_path}"
    text = server.log_text()
    if re.search(r"in a buffer \(\w+\) that cannot run the operation \(SET_ROWS\)", text):
        hint = (f"this build's GPU backend cannot store this cache type (no kernels for it): keep the KV cache on "
                f"the CPU with `-- -nkvo`, or pick types the GPU supports; {hint}")
    # the cause, not the backtrace after it
    culprit = next((ln for ln in reversed(log_tail(server.log_path, 100))
                    if re.search(r"error|abort|failed|cannot|GGML_ASSERT", ln, re.I)
                    and not re.search(r"\[0x[0-9a-f]+\]\s*$", ln)), tail[-1] if tail else "no output")
    return TqError(f"llama-server {when} ({server.exit_text()}): {culprit.strip()[:300]}", hint, code=EXIT_WARN)


def start(req: ServeRequest, ui: Ui, stop: StopRequest) -> tuple[Server, Running]:
    """Check, launch, wait until ready and verify. On any failure the server is stopped before raising."""
    from .client import Client, ServerError

    if not is_loopback(req.host) and not req.api_key:
        raise TqError(f"--host {req.host} is reachable from other machines and there is no --api-key",
                      "give --api-key KEY (clients then send it as a Bearer token), or bind to 127.0.0.1")
    plan = precheck(req)
    binary = find_server(req.backends)
    # a build named by --bin-dir / $TQGGUF_BIN_DIR says itself what it was built for (a CUDA build's GPU pairs)
    built_for = (manifest_of(binary) or {}).get("backends")
    if built_for and built_for != req.backends:
        req = replace(req, backends=built_for)
        plan = precheck(req)
    for n in plan.notes:
        ui.warn(n)
    if req.boundary_n > 0:
        try:
            helptext = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            helptext = ""
        if "--cache-boundary-layers" not in helptext:
            raise TqError(f"{binary} has no boundary-layer V policy (--cache-boundary-layers)",
                          "rebuild with `tqgguf build` (the series has the patch), or pass --boundary-v 0")
    port = pick_port(req.host, req.port)
    log_path = req.log_file or default_log_path(req.model, port)
    server = Server(binary, server_args(req, plan, port), log_path, req.api_key)
    url_host = f"[{req.host}]" if ":" in req.host else req.host
    url = f"http://{url_host}:{port}"
    client = Client(url, api_key=req.api_key, timeout=30)
    try:
        t0 = time.monotonic()
        state = {"s": "starting"}
        status_cm = ui.status(f"starting llama-server on {url}") if ui.status else None
        if status_cm is not None:
            status_cm.__enter__()
        try:
            while True:
                if stop.requested:
                    raise TqError("interrupted while the server was starting", code=130)
                if not server.alive():
                    raise _dead(server, "exited while starting", ui)
                try:
                    code, _ = client.health(timeout=2.0)
                    state["s"] = "ready" if code == 200 else "loading the model" if code == 503 else f"HTTP {code}"
                except ServerError:
                    state["s"] = "starting"
                if state["s"] == "ready":
                    break
                if time.monotonic() - t0 > req.startup_timeout:
                    raise TqError(f"llama-server was not ready after {req.startup_timeout:g} s ({state['s']})",
                                  f"log: {log_path}", code=EXIT_WARN)
                if status_cm is not None and hasattr(status_cm, "update"):
                    status_cm.update(f"llama-server on {url}: {state['s']} ({time.monotonic() - t0:.0f} s)")
                time.sleep(0.2)
        finally:
            if status_cm is not None:
                status_cm.__exit__(None, None, None)

        eff = parse_server_log(server.log_text())
        deviations = compare(req, plan, eff)
        estimate = None
        if plan.facts.kv_layers and eff.caches:
            c0 = eff.caches[0]
            estimate = expected_kv(plan, ctx=eff.n_ctx or c0["cells"], n_seq=c0["seqs"], unified=c0["streams"] == 1,
                                   swa_full="--swa-full" in req.extra)
        notes = list(plan.notes)
        if estimate and eff.kv_mib is not None and abs(estimate["total_mib"] - eff.kv_mib) > 0.011 * len(eff.caches):
            notes.append(f"KV cache is {eff.kv_mib} MiB, tqgguf check estimated {estimate['total_mib']} MiB")
        running = Running(
            url=url, pid=server.pid, log=str(log_path), model=str(req.model),
            requested={"k": req.k, "v": req.v, "boundary_v": req.boundary_n, "boundary_v_type": req.boundary_type,
                       "policy": req.policy, "ctx": req.ctx, "parallel": req.parallel, "host": req.host,
                       "port": port, "flash_attn": plan.flash_attn},
            effective={"k": eff.k, "v": eff.v, "v_types": format_v_types(eff.v_layers) if eff.v_layers else None,
                       "boundary_layers": eff.boundary_layers, "boundary_type": eff.boundary_type,
                       "flash_attn": eff.flash_attn, "attention_layers": eff.fa_layers,
                       "attention_on_layer_device": eff.fa_on_device, "attention_moved": eff.fa_moved,
                       "attention_converted": eff.fa_converted,
                       "kv_mib": eff.kv_mib, "k_mib": eff.k_mib, "v_mib": eff.v_mib, "caches": eff.caches,
                       "n_ctx": eff.n_ctx, "slots": eff.slots, "n_ctx_slot": eff.n_ctx_slot,
                       "fallbacks": eff.fallbacks},
            kv_estimate=estimate, deviations=deviations, notes=notes)
        if deviations and not req.allow_fallback:
            for d in deviations:
                ui.warn(d)
            raise TqError(f"llama-server is not running what was requested: {deviations[0]}"
                          + (f" (and {len(deviations) - 1} more)" if len(deviations) > 1 else ""),
                          "pass --allow-fallback to serve anyway", code=EXIT_WARN)
        for d in deviations:
            ui.warn(f"FALLBACK: {d}")
        return server, running
    except BaseException:
        server.stop()
        raise
    finally:
        client.close()


def supervise(server: Server, stop: StopRequest, ui: Ui | None = None, poll: float = 0.2) -> int:
    """Wait until a stop signal (stop the process group, return 0) or the server's death (TqError)."""
    try:
        while not stop.requested:
            if not server.alive():
                raise _dead(server, "died", ui)
            time.sleep(poll)
        return 0
    finally:
        server.stop()


def describe(r: Running) -> list[str]:
    """The human summary of a running server."""
    e, q = r.effective, r.requested
    lines = [f"serving {Path(r.model).name} at {r.url}  (pid {r.pid})"]
    if q.get("policy"):
        p = load_policies().get(q["policy"])
        m = p.measured if p else {}
        lines.append(f"  policy      {q['policy']}" + (f" (measured KLD {m['kld']:.4f} vs an f16 cache, "
                                                      f"{m['kv_bits_per_value']:.2f} bits/value, on "
                                                      f"{m['model'].split(' ')[0]})" if m else ""))
    v = e["v_types"] or e["v"]
    lines.append(f"  KV cache    K {e['k']}, V {v}")
    if e["boundary_layers"] is not None:
        lines.append(f"  boundary    V of layers {_layer_list(e['boundary_layers']) or 'none'} at {e['boundary_type']} "
                     f"(--boundary-v {q['boundary_v']})")
    elif q["boundary_v"] == 0 and q["v"] == "turbo2":
        lines.append("  boundary    off (--boundary-v 0)")
    fa = {True: "on", False: "off", None: "unknown"}[e["flash_attn"]]
    where = ""
    if e["attention_layers"] is not None:
        where = f", {e['attention_on_layer_device']} of {e['attention_layers']} layers on their own device"
    lines.append(f"  attention   flash attention {fa}{where}")
    if e["kv_mib"] is not None:
        est = f"; tqgguf check: {r.kv_estimate['total_mib']} MiB" if r.kv_estimate else ""
        lines.append(f"  memory      {e['kv_mib']} MiB (K {e['k_mib']}, V {e['v_mib']}){est}")
    if e["slots"]:
        lines.append(f"  slots       {e['slots']} x {e['n_ctx_slot']} tokens (n_ctx {e['n_ctx']})")
    lines.append(f"  log         {r.log}")
    return lines


def run_serve(req: ServeRequest, ui: Ui, on_ready: Callable[[Running], None]) -> int:
    """The whole command: start, report, supervise until stopped. Returns the exit code."""
    with StopRequest() as stop:
        server, running = start(req, ui, stop)
        try:
            on_ready(running)
        except BaseException:
            server.stop()
            raise
        return supervise(server, stop, ui)


__all__ = ["Policy", "load_policies", "ServeRequest", "make_request", "Plan", "precheck", "expected_kv",
           "Effective", "parse_server_log", "compare", "format_v_types", "parse_v_types", "find_server",
           "pick_port", "server_args", "Server", "StopRequest", "Running", "Ui", "start", "supervise", "describe",
           "run_serve"]
