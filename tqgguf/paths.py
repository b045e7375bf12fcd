"""Where tqgguf keeps things: the repo's patches and the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TqError


def cache_dir() -> Path:
    """$TQGGUF_CACHE, else $XDG_CACHE_HOME/tqgguf, else ~/.cache/tqgguf."""
    env = os.environ.get("TQGGUF_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "tqgguf").resolve()


def patches_dir() -> Path:
    """The patch series: $TQGGUF_PATCHES, else `patches/` beside the package (a source checkout)."""
    env = os.environ.get("TQGGUF_PATCHES")
    d = Path(env).expanduser() if env else Path(__file__).resolve().parent.parent / "patches"
    if not (d / "source.toml").is_file():
        raise TqError(
            f"no patch series found at {d}",
            "install tqgguf from its source checkout (pip install -e .) or set TQGGUF_PATCHES",
        )
    return d
