"""The patch series: apply/export round trip, a failing patch named, in-place sync touches only what changes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tqgguf.errors import TqError
from tqgguf.patches import (BASE_TAG, am_series, check_series, export_series, init_repo, sync_series,
                            touched_files)

GIT_ENV = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.invalid", "GIT_COMMITTER_NAME": "dev",
           "GIT_COMMITTER_EMAIL": "dev@example.invalid", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(tree: Path, *args: str) -> str:
    env = dict(os.environ, **GIT_ENV, GIT_CEILING_DIRECTORIES=str(tree.parent))
    return subprocess.run(["git", *args], cwd=tree, env=env, check=True, capture_output=True, text=True).stdout


def _pristine(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.c").write_text("int a(void) {\n    return 1;\n}\n")
    (root / "src" / "b.c").write_text("int b(void) {\n    return 2;\n}\n")
    (root / "README").write_text("upstream\n")
    return root


def _make_series(tmp: Path) -> tuple[Path, list[Path]]:
    """A pristine tree and a two-patch series made by the maintenance loop itself."""
    pristine = _pristine(tmp / "pristine")
    dev = tmp / "dev"
    shutil.copytree(pristine, dev)
    init_repo(dev, "upstream")
    (dev / "src" / "a.c").write_text("int a(void) {\n    return 10;\n}\n")
    git(dev, "commit", "-qam", "a: return ten\n\nWhat: a() returns 10.\nWhy: a test.")
    (dev / "src" / "new.c").write_text("int n;\n")
    (dev / "README").write_text("upstream\npatched\n")
    git(dev, "add", "-A")
    git(dev, "commit", "-qm", "add new.c")
    out = tmp / "series"
    names, written = export_series(dev, out)
    assert names == ["0001-a-return-ten.patch", "0002-add-new.c.patch"] and written == names
    return pristine, [out / n for n in names]


def test_apply_then_export_is_byte_identical(tmp_path):
    pristine, series = _make_series(tmp_path)
    text = series[0].read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")  # --zero-commit
    assert "Date: Thu, 1 Jan 2026 00:00:00 +0000" in text and "\n-- \n" not in text  # fixed date, no signature
    # The loop: a fresh tree, apply as commits, export again: same bytes.
    tree = tmp_path / "again"
    shutil.copytree(pristine, tree)
    init_repo(tree, "upstream")
    am_series(tree, series)
    assert git(tree, "log", "--format=%s", f"{BASE_TAG}..HEAD").split("\n")[:2] == ["add new.c", "a: return ten"]
    out2 = tmp_path / "series2"
    names, _ = export_series(tree, out2)
    for p in series:
        assert (out2 / p.name).read_bytes() == p.read_bytes()
    # Exporting onto itself writes nothing.
    assert export_series(tree, out2)[1] == []


def test_export_after_edit_changes_only_that_patch_and_drops_stale(tmp_path):
    pristine, series = _make_series(tmp_path)
    tree = tmp_path / "edit"
    shutil.copytree(pristine, tree)
    init_repo(tree, "upstream")
    am_series(tree, series[:1])  # drop the second patch
    (tree / "src" / "b.c").write_text("int b(void) {\n    return 20;\n}\n")
    git(tree, "commit", "-qam", "b: return twenty")
    out = series[0].parent
    names, written = export_series(tree, out)
    assert names == ["0001-a-return-ten.patch", "0002-b-return-twenty.patch"]
    assert set(written) == {"0002-b-return-twenty.patch", "0002-add-new.c.patch"}
    assert not (out / "0002-add-new.c.patch").exists()


def test_failing_patch_is_named_with_file(tmp_path):
    pristine, series = _make_series(tmp_path)
    (pristine / "src" / "a.c").write_text("int a(void) {\n    return 3;\n}\n")  # upstream moved on
    with pytest.raises(TqError) as e:
        check_series(pristine, series)
    assert "0001-a-return-ten.patch" in e.value.message and "src/a.c" in e.value.message
    assert e.value.code == 1


def test_sync_touches_only_changed_files(tmp_path):
    pristine, series = _make_series(tmp_path)
    work = tmp_path / "work"
    changed = sync_series(pristine, work, series)
    assert sorted(changed) == ["README", "src/a.c", "src/new.c"]
    assert (work / "src" / "a.c").read_text().endswith("return 10;\n}\n")
    old = 1_600_000_000
    for f in ("src/a.c", "src/b.c", "src/new.c", "README"):
        os.utime(work / f, (old, old))
    # Same series again: nothing written, timestamps kept.
    assert sync_series(pristine, work, series) == []
    assert all((work / f).stat().st_mtime == old for f in ("src/a.c", "src/new.c", "README"))
    # Drop the second patch: its files go back to pristine (new.c removed), a.c untouched.
    changed = sync_series(pristine, work, series[:1])
    assert sorted(changed) == ["README", "src/new.c"]
    assert not (work / "src" / "new.c").exists() and (work / "README").read_text() == "upstream\n"
    assert (work / "src" / "a.c").stat().st_mtime == old and (work / "src" / "b.c").stat().st_mtime == old


def test_sync_mirrors_a_local_tree_that_changed(tmp_path):
    """`tqgguf build --source DIR` keys its work copy by DIR and its commit, which stay the same while DIR is edited:
    the files the series does not touch follow DIR (new, edited, removed), the patched ones stay patched, nothing
    unchanged is rewritten, and git's folder and an in-tree CMake build folder are not copied file by file."""
    pristine, series = _make_series(tmp_path)
    work = tmp_path / "work"
    sync_series(pristine, work, series, mirror=True)
    old = 1_600_000_000
    for f in ("src/a.c", "src/b.c", "src/new.c", "README"):
        os.utime(work / f, (old, old))
    os.utime(pristine / "src" / "b.c", (old, old))
    assert sync_series(pristine, work, series, mirror=True) == []       # b.c's timestamp now matches: not copied
    assert (work / "src" / "b.c").stat().st_mtime == old

    (pristine / "src" / "b.c").write_text("int b(void) {\n    return 22;\n}\n")   # the developer edits DIR
    (pristine / "src" / "c.c").write_text("int c;\n")
    (pristine / "docs").mkdir()
    (pristine / "docs" / "x.md").write_text("x\n")
    (pristine / "build").mkdir()                                                 # an in-tree build
    (pristine / "build" / "CMakeCache.txt").write_text("cache\n")
    (pristine / ".git").mkdir()
    (pristine / ".git" / "HEAD").write_text("ref\n")
    changed = sync_series(pristine, work, series, mirror=True)
    assert sorted(changed) == ["docs/x.md", "src/b.c", "src/c.c"]
    assert (work / "src" / "b.c").read_text().endswith("return 22;\n}\n") and (work / "src" / "c.c").is_file()
    assert (work / "src" / "a.c").read_text().endswith("return 10;\n}\n")        # still patched, not rewritten
    assert (work / "src" / "a.c").stat().st_mtime == old and (work / "README").stat().st_mtime == old
    assert not (work / "build").exists() and not (work / ".git").exists()
    assert sync_series(pristine, work, series, mirror=True) == []

    (pristine / "src" / "c.c").unlink()
    shutil.rmtree(pristine / "docs")
    assert sorted(sync_series(pristine, work, series, mirror=True)) == ["docs/x.md", "src/c.c"]
    assert not (work / "src" / "c.c").exists() and (work / "src" / "new.c").is_file()   # the series' new file stays
    # without mirror (a verified sdist) a change to the source is not looked for
    (pristine / "src" / "b.c").write_text("int b(void) {\n    return 23;\n}\n")
    assert sync_series(pristine, work, series) == []


def test_touched_files(tmp_path):
    _, series = _make_series(tmp_path)
    assert touched_files(series[1]) == ["README", "src/new.c"]


def test_real_series_checks_and_round_trips(pin, llama_source, tmp_path):
    """The committed series applies to the pinned source, and apply -> export reproduces it byte for byte."""
    files = check_series(llama_source, pin.patch_paths)
    assert files
    tree = tmp_path / "llama.cpp"
    # Only the files the series touches are needed for the round trip; copying them keeps this fast.
    for rel in files:
        if (llama_source / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(llama_source / rel, tree / rel)
    init_repo(tree, "upstream")
    am_series(tree, pin.patch_paths)
    out = tmp_path / "export"
    names, _ = export_series(tree, out)
    assert names == pin.series
    for p in pin.patch_paths:
        assert (out / p.name).read_bytes() == p.read_bytes(), f"{p.name} does not round-trip"


def test_every_patch_has_a_what_and_why_header(pin):
    for p in pin.patch_paths:
        head = p.read_text().split("\n---\n", 1)[0]
        assert "What:" in head and "Why:" in head, f"{p.name} lacks a What:/Why: header"


def test_patches_readme_groups_every_patch_once(pin):
    """patches/README.md's table "The series by concern" names each patch of source.toml in exactly one row."""
    text = (pin.patch_paths[0].parent / "README.md").read_text()
    table = text.split("## The series by concern", 1)[1].split("\n## ", 1)[0]
    listed: list[int] = []
    for line in table.splitlines():
        if not re.match(r"\| \d{4}", line):
            continue
        for part in line.split("|")[1].split(","):
            lo, _, hi = part.strip().partition("-")
            listed.extend(range(int(lo), int(hi or lo) + 1))
    series = [int(name[:4]) for name in pin.series]
    assert sorted(listed) == sorted(series), (
        f"missing: {sorted(set(series) - set(listed))}, extra or twice: "
        f"{sorted(n for n in set(listed) if listed.count(n) > 1 or n not in series)}")
