"""tqgguf.textdata: the evaluation text, with and without ../shared/data."""

from __future__ import annotations

import tqgguf.textdata as textdata


def test_generated_text_in_a_fresh_cache_folder(tmp_path, monkeypatch):
    # a user's clone has no ../shared/data, and a first run has no cache folder yet (tqgguf niah failed with a
    # traceback there: FileNotFoundError on the generated text's path)
    monkeypatch.setattr(textdata, "SHARED_WIKITEXT", tmp_path / "no-shared" / "wikitext-2-raw-test.txt")
    cache = tmp_path / "fresh" / "cache"
    path = textdata.eval_text(cache)
    assert path == cache / "tqgguf-generated-text.txt"
    assert path.read_text(encoding="utf-8") == textdata.generated_text()
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left behind
    mtime = path.stat().st_mtime_ns
    assert textdata.eval_text(cache) == path and path.stat().st_mtime_ns == mtime  # reused, not written again


def test_shared_wikitext_when_present(tmp_path, monkeypatch):
    shared = tmp_path / "shared" / "wikitext-2-raw-test.txt"
    shared.parent.mkdir(parents=True)
    shared.write_text(" = An article = \n", encoding="utf-8")
    monkeypatch.setattr(textdata, "SHARED_WIKITEXT", shared)
    cache = tmp_path / "cache"
    assert textdata.eval_text(cache) == shared
    assert not cache.exists()


def test_generated_text_is_deterministic():
    a = textdata.generated_text(n_paragraphs=50)
    assert a == textdata.generated_text(n_paragraphs=50)
    assert a.count("\n\n") == 49 and len(a) > 10_000
