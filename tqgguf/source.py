"""Get and verify the pinned llama.cpp source (from the llama-cpp-python sdist) or use a local tree."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .errors import TqError
from .patches import BASE_TAG, _git
from .paths import cache_dir
from .pin import Pin

MARKER = ".tqgguf-source.json"

Log = Callable[[str], None]


@dataclass
class Source:
    """A pristine llama.cpp tree: never modified; patched copies live in the work tree."""

    root: Path
    kind: str  # "sdist" or "local"
    key: str  # short id used in cache paths and build keys
    commit: str
    sha256: str | None = None
    version: str | None = None
    series_in_tree: bool = False  # a `tqgguf patches apply` tree: the series is in its commits, built as it is

    def to_dict(self) -> dict:
        d = asdict(self)
        d["root"] = str(self.root)
        return d


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _quiet(msg: str) -> None:
    pass


def sdist_path(pin: Pin) -> Path:
    return cache_dir() / "sdist" / pin.filename


def fetch_sdist(pin: Pin, log: Log = _quiet) -> Path:
    """The verified sdist in the cache, downloading it with pip when absent.

    $TQGGUF_SDIST may name a local copy of the archive (offline machines); it is
    verified like a download and copied into the cache.
    """
    dest = sdist_path(pin)
    if dest.is_file():
        verify_sdist(dest, pin)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    local = os.environ.get("TQGGUF_SDIST")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        if local:
            src = Path(local).expanduser()
            if not src.is_file():
                raise TqError(f"TQGGUF_SDIST={local} is not a file")
            got = Path(tmp) / pin.filename
            shutil.copyfile(src, got)
        else:
            log(f"downloading {pin.pip_spec} (sdist) with pip ...")
            got = _pip_download(pin, Path(tmp))
        verify_sdist(got, pin)
        os.replace(got, dest)
    return dest


def _pip_download(pin: Pin, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", pin.pip_spec, "-d", str(into)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise TqError(f"cannot run pip: {e}", "install pip for this Python") from None
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "ERROR" in ln or "rror" in ln), lines[-1] if lines else "")
        raise TqError(
            f"pip could not download {pin.pip_spec}: {last}",
            "check the network or your pip index settings, or set TQGGUF_SDIST=/path/to/" + pin.filename,
        )
    found = list(into.glob("*.tar.gz"))
    if not found:
        raise TqError(f"pip downloaded no sdist for {pin.pip_spec}",
                      "check that your index serves source distributions (--no-binary)")
    return found[0]


def verify_sdist(path: Path, pin: Pin) -> None:
    got = sha256_file(path)
    if got != pin.sha256:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        raise TqError(
            f"sha256 mismatch for {path.name}: expected {pin.sha256[:16]}..., got {got[:16]}... (moved aside to {bad})",
            "the download is corrupt or not the pinned release; run `tqgguf source` again",
        )


def extract(pin: Pin, archive: Path, log: Log = _quiet) -> Path:
    """Extract `pin.subdir` of the sdist once into the cache; returns the tree's root."""
    root = cache_dir() / "src" / pin.sha256[:12] / "llama.cpp"
    if (root / MARKER).is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    log(f"extracting {pin.subdir} from {archive.name} ...")
    top = archive.name.removesuffix(".tar.gz")
    prefix = f"{top}/{pin.subdir}/"
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        out = Path(tmp) / "llama.cpp"
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = []
                for m in tar.getmembers():
                    if m.name.startswith(prefix) and len(m.name) > len(prefix):
                        m.name = m.name[len(prefix):]
                        members.append(m)
                if not members:
                    raise TqError(f"{archive.name} has no {pin.subdir}/", "is this the pinned sdist?")
                tar.extractall(out, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise TqError(f"cannot extract {archive.name}: {e}", "delete it from the cache and run `tqgguf source` again") from None
        # The sdist keeps a `.git` file pointing into llama-cpp-python's repository; it would confuse git.
        gitfile = out / ".git"
        if gitfile.is_file():
            gitfile.unlink()
        (out / MARKER).write_text(json.dumps(
            {"sha256": pin.sha256, "version": pin.version, "commit": pin.upstream_commit}, indent=1) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(out, root)
    return root


def pinned_source(pin: Pin, log: Log = _quiet) -> Source:
    root = extract(pin, fetch_sdist(pin, log), log)
    return Source(root=root, kind="sdist", key=pin.sha256[:12], commit=pin.upstream_commit,
                  sha256=pin.sha256, version=pin.version)


def cached_pinned_source(pin: Pin) -> Source | None:
    """The pinned source if it is already extracted (no download, no hashing)."""
    root = cache_dir() / "src" / pin.sha256[:12] / "llama.cpp"
    if (root / MARKER).is_file():
        return Source(root=root, kind="sdist", key=pin.sha256[:12], commit=pin.upstream_commit,
                      sha256=pin.sha256, version=pin.version)
    return None


def local_source(path: Path) -> Source:
    root = path.expanduser().resolve()
    if not (root / "CMakeLists.txt").is_file() or not (root / "ggml").is_dir():
        raise TqError(f"{root} does not look like a llama.cpp source tree (no CMakeLists.txt and ggml/)")
    commit = "unknown"
    applied = False
    # patches._git looks no higher than the tree: a tree unpacked inside another checkout is not at that one's commit
    try:
        r = _git(["rev-parse", "HEAD"], root, check=False)
        if r.returncode == 0:
            commit = r.stdout.strip()
            if _git(["status", "--porcelain", "--untracked-files=no"], root, check=False).stdout.strip():
                commit += "-dirty"
            applied = _git(["rev-parse", "-q", "--verify", f"refs/tags/{BASE_TAG}"], root, check=False).returncode == 0
    except TqError:   # git is not installed: the commit stays unknown
        pass
    # keyed by the path alone: a new commit or an edit is brought into the same work copy and build folder (only the
    # changed files are copied and rebuilt); the commit is recorded in the build's manifest
    key = "local-" + hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return Source(root=root, kind="local", key=key, commit=commit, series_in_tree=applied)


def resolve_source(pin: Pin, path: Path | None, log: Log = _quiet) -> Source:
    return local_source(path) if path else pinned_source(pin, log)
