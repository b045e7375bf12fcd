"""Run a llama.cpp tool while it runs: its stdout and stderr arrive in pieces (for progress bars), the child is in
its own process group and dies with tqgguf, and Ctrl-C or a time-out stop the whole group."""

from __future__ import annotations

import codecs
import os
import re
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from .errors import TqError


@dataclass
class ToolRun:
    returncode: int
    stdout: str
    stderr: str
    log: str          # both, in the order they arrived (for a log file)
    seconds: float

    @property
    def text(self) -> str:
        """stdout then stderr: what the parsers read (each stream's lines intact)."""
        return self.stdout + "\n" + self.stderr


def _child_setup() -> None:  # pragma: no cover - runs in the child
    from .serve import _child_setup as setup

    setup()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def stream(cmd: list[str], what: str, on_output: Callable[[str, str], None] | None = None,
           timeout: float | None = None) -> ToolRun:
    """Run cmd, calling on_output(piece, "stdout" | "stderr") as output arrives; return exit code and output."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_child_setup if os.name == "posix" else None)
    except OSError as e:
        raise TqError(f"cannot run {cmd[0]}: {e.strerror}", "run `tqgguf build` first") from None
    parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
    log: list[str] = []
    # a read may split a UTF-8 character (llama-perplexity prints ±)
    dec = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in parts}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    open_streams = 2
    try:
        while open_streams:
            if timeout is not None and time.monotonic() - t0 > timeout:
                _stop(proc)
                raise TqError(f"{what} timed out after {timeout:g} s", code=1)
            for key, _ in sel.select(timeout=0.5):
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                piece = dec[key.data].decode(data)
                parts[key.data].append(piece)
                log.append(piece)
                if on_output is not None:
                    on_output(piece, key.data)
        proc.wait()
    except BaseException:
        _stop(proc)
        raise
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return ToolRun(proc.returncode, "".join(parts["stdout"]), "".join(parts["stderr"]), "".join(log),
                   round(time.monotonic() - t0, 2))


# a line llama.cpp logged at error level, with -lv's timestamp: "0.00.210.551 E perplexity: you need at least ..."
_ERROR_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ E (.+)$")


def tail(text: str, n: int = 3) -> str:
    """What a one-line error shows of a tool's output: the last n lines the tool logged as errors, else the last n
    non-empty lines, joined."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [m.group(1) for ln in lines if (m := _ERROR_LINE.match(ln))]
    return " | ".join((errors or lines)[-n:])
