"""Pin file and source verification: a good archive extracts, a corrupted one is refused in one line."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tqgguf.errors import TqError
from tqgguf.pin import Pin, load_pin, write_series
from tqgguf.source import extract, fetch_sdist, local_source, sha256_file


def _fake_sdist(tmp: Path) -> Path:
    """A tiny sdist with the same layout as llama-cpp-python's: <top>/vendor/llama.cpp/..."""
    path = tmp / "llama_cpp_python-9.9.9.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {
            "llama_cpp_python-9.9.9/pyproject.toml": b"[project]\n",
            "llama_cpp_python-9.9.9/vendor/llama.cpp/CMakeLists.txt": b"project(llama)\n",
            "llama_cpp_python-9.9.9/vendor/llama.cpp/ggml/x.c": b"int x;\n",
            "llama_cpp_python-9.9.9/vendor/llama.cpp/.git": b"gitdir: ../../.git/modules/vendor/llama.cpp\n",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _pin_for(archive: Path, sha: str | None = None) -> Pin:
    return Pin(package="llama-cpp-python", version="9.9.9", filename=archive.name,
               sha256=sha or sha256_file(archive), subdir="vendor/llama.cpp", upstream_commit="abc1234")


def test_pin_file_is_complete():
    pin = load_pin()
    assert pin.package == "llama-cpp-python" and pin.version == "0.3.36"
    assert len(pin.sha256) == 64 and int(pin.sha256, 16) >= 0
    assert pin.upstream_commit.startswith("0c1e57098")
    assert pin.series, "the series is empty"
    for p in pin.patch_paths:
        assert p.is_file() and p.name[:4].isdigit()
    assert [p.name for p in pin.patch_paths] == sorted(p.name for p in pin.patch_paths)


def test_good_archive_extracts_once(tmp_path, monkeypatch):
    archive = _fake_sdist(tmp_path)
    monkeypatch.setenv("TQGGUF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TQGGUF_SDIST", str(archive))
    pin = _pin_for(archive)
    got = fetch_sdist(pin)
    assert got.parent == tmp_path / "cache" / "sdist" and sha256_file(got) == pin.sha256
    root = extract(pin, got)
    assert (root / "CMakeLists.txt").read_bytes() == b"project(llama)\n"
    assert (root / "ggml" / "x.c").is_file()
    assert not (root / ".git").exists(), "the sdist's .git pointer must not survive"
    assert not (root.parent.parent.parent / "pyproject.toml").exists()
    # Second call: cached, no re-extraction.
    (root / "ggml" / "x.c").write_text("changed")
    assert extract(pin, got) == root and (root / "ggml" / "x.c").read_text() == "changed"


def test_corrupted_archive_is_refused(tmp_path, monkeypatch):
    archive = _fake_sdist(tmp_path)
    good = sha256_file(archive)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad" / archive.name
    bad.parent.mkdir()
    bad.write_bytes(bytes(data))
    monkeypatch.setenv("TQGGUF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TQGGUF_SDIST", str(bad))
    with pytest.raises(TqError) as e:
        fetch_sdist(_pin_for(archive, good))
    assert "sha256 mismatch" in e.value.message
    assert not (tmp_path / "cache" / "sdist" / archive.name).exists(), "a bad archive must not be cached"
    assert bad.is_file(), "the user's file must not be lost"


def test_cli_hash_mismatch_is_one_line(tmp_path):
    """Through the CLI: exit code 2, an `error:` line, a hint, no traceback."""
    archive = _fake_sdist(tmp_path)
    env = {"TQGGUF_CACHE": str(tmp_path / "cache"), "TQGGUF_SDIST": str(archive), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "tqgguf", "source"], capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "sha256 mismatch" in r.stderr and "hint:" in r.stderr


def test_local_source_and_bad_path(tmp_path):
    (tmp_path / "ggml").mkdir()
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    src = local_source(tmp_path)
    assert src.kind == "local" and src.key.startswith("local-") and src.commit == "unknown"
    with pytest.raises(TqError):
        local_source(tmp_path / "ggml")



def test_local_source_commit_is_its_own_repository(tmp_path):
    """A tree's commit is recorded only where the tree is the top of a git repository: one unpacked inside another
    checkout (a device run's copy of tqgguf) is not at that checkout's commit."""
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.invalid", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_CEILING_DIRECTORIES=str(tmp_path))

    def git(cwd, *args):
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout

    outer = tmp_path / "outer"
    tree = outer / "sub" / "llama.cpp"
    (tree / "ggml").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(x)\n")
    git(outer, "init", "-q")
    git(outer, "add", "-A")
    git(outer, "commit", "-qm", "outer")
    assert local_source(tree).commit == "unknown"
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "tree")
    head = git(tree, "rev-parse", "HEAD").strip()
    assert local_source(tree).commit == head
    (tree / "CMakeLists.txt").write_text("project(y)\n")
    assert local_source(tree).commit == head + "-dirty"

def test_write_series_keeps_comments(tmp_path):
    pin_path = tmp_path / "source.toml"
    pin_path.write_text('# keep me\n[source]\nx = 1\n\n[patches]\nseries = [\n    "old.patch",\n]\n# tail\n')
    write_series(pin_path, ["0001-a.patch", "0002-b.patch"])
    text = pin_path.read_text()
    assert text.startswith("# keep me\n") and text.endswith("# tail\n")
    assert '"0001-a.patch",\n    "0002-b.patch",\n]' in text and "old.patch" not in text


def test_real_pinned_sdist_matches_pin(pin, pinned):
    """The cached pinned archive has the pinned hash and vendors the pinned commit's tree."""
    from tqgguf.source import sdist_path

    assert sha256_file(sdist_path(pin)) == pin.sha256
    assert (pinned.root / "ggml" / "include" / "ggml.h").is_file()
    assert "GGML_TYPE_Q2_0" in (pinned.root / "ggml" / "include" / "ggml.h").read_text()
