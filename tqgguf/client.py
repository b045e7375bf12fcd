"""A small client for llama-server: /health, /props, /completion, /v1/chat/completions, /metrics.

Every call has a timeout; failures are raised as ServerError (a TqError: one line and an exit code), never as a
requests traceback.

    from tqgguf.client import Client
    c = Client("http://127.0.0.1:8080", api_key=None)
    c.wait_ready(timeout=120)
    print(c.chat([{"role": "user", "content": "Hello"}], max_tokens=32)["choices"][0]["message"]["content"])
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import requests

from .errors import EXIT_WARN, TqError

# one Prometheus sample line: name{labels} value
_METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


class ServerError(TqError):
    """The server answered with an error, or could not be reached."""

    def __init__(self, message: str, hint: str | None = None, status: int | None = None):
        super().__init__(message, hint, code=EXIT_WARN)
        self.status = status


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # never route a loopback server through a proxy from the environment
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport ----

    def _request(self, method: str, path: str, timeout: float | None = None, **kw: Any) -> requests.Response:
        url = self.base_url + path
        try:
            return self.session.request(method, url, timeout=timeout or self.timeout, **kw)
        except requests.Timeout:
            raise ServerError(f"{method} {url} timed out after {timeout or self.timeout:g} s") from None
        except requests.ConnectionError as e:
            raise ServerError(f"cannot reach {url}: {_reason(e)}") from None

    def _json(self, method: str, path: str, **kw: Any) -> dict:
        r = self._request(method, path, **kw)
        if r.status_code != 200:
            raise ServerError(f"{method} {path} answered {r.status_code}: {_error_text(r)}", status=r.status_code)
        try:
            return r.json()
        except ValueError:
            raise ServerError(f"{method} {path} answered something that is not JSON: {r.text[:200]!r}") from None

    # ---- endpoints ----

    def health(self, timeout: float = 5.0) -> tuple[int, dict]:
        """(HTTP status, body): 200 when ready, 503 while the model loads. Raises ServerError when unreachable."""
        r = self._request("GET", "/health", timeout=timeout)
        try:
            body = r.json()
        except ValueError:
            body = {"text": r.text[:200]}
        return r.status_code, body

    def wait_ready(self, timeout: float = 600.0, interval: float = 0.25,
                   alive: Callable[[], bool] | None = None, tick: Callable[[str], None] | None = None) -> None:
        """Poll /health until it answers 200. `alive()` returning False stops the wait (the server died);
        `tick(state)` is called on each poll (state: "starting" before the port answers, "loading" on 503)."""
        deadline = time.monotonic() + timeout
        while True:
            if alive is not None and not alive():
                raise ServerError("the server exited while starting")
            try:
                status, _ = self.health(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
                state = "ready" if status == 200 else "loading" if status == 503 else f"HTTP {status}"
            except ServerError:
                state = "starting"
            if state == "ready":
                return
            if tick:
                tick(state)
            if time.monotonic() >= deadline:
                raise ServerError(f"the server was not ready after {timeout:g} s (last state: {state})")
            time.sleep(interval)

    def props(self) -> dict:
        return self._json("GET", "/props")

    def completion(self, prompt: str, n_predict: int = 64, temperature: float = 0.0, **kw: Any) -> dict:
        """POST /completion (llama.cpp's native endpoint); the text is in ["content"]."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, **kw}
        return self._json("POST", "/completion", json=body)

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """POST /tokenize: the model's tokens for text."""
        d = self._json("POST", "/tokenize", json={"content": text, "add_special": add_special})
        return [t if isinstance(t, int) else t["id"] for t in d.get("tokens", [])]

    def detokenize(self, tokens: list[int]) -> str:
        """POST /detokenize: the text of tokens."""
        return self._json("POST", "/detokenize", json={"tokens": tokens}).get("content", "")

    def apply_template(self, messages: list[dict]) -> str:
        """POST /apply-template: the prompt the server's chat template makes of messages (not run)."""
        return self._json("POST", "/apply-template", json={"messages": messages}).get("prompt", "")

    def chat(self, messages: list[dict], max_tokens: int = 64, temperature: float = 0.0, **kw: Any) -> dict:
        """POST /v1/chat/completions (OpenAI format); the text is in ["choices"][0]["message"]["content"]."""
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, **kw}
        return self._json("POST", "/v1/chat/completions", json=body)

    def chat_text(self, prompt: str, max_tokens: int = 64, temperature: float = 0.0, **kw: Any) -> str:
        r = self.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=temperature, **kw)
        try:
            return r["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"unexpected chat answer: {str(r)[:200]}") from None

    def metrics(self) -> dict[str, float]:
        """GET /metrics (llama-server --metrics) as {name: value}; labelled samples keep their labels in the key."""
        r = self._request("GET", "/metrics")
        if r.status_code != 200:
            raise ServerError(f"GET /metrics answered {r.status_code}: {_error_text(r)}",
                              "start llama-server with --metrics (tqgguf serve does)", status=r.status_code)
        return parse_metrics(r.text)


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                continue
    return out


def _error_text(r: requests.Response) -> str:
    try:
        body = r.json()
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        return str(err)[:300]
    except ValueError:
        return r.text.strip()[:300] or r.reason


def _reason(e: Exception) -> str:
    text = str(e)
    for key in ("Connection refused", "Name or service not known", "timed out", "No route to host"):
        if key in text:
            return key.lower()
    return text.splitlines()[0][:200] if text else type(e).__name__
