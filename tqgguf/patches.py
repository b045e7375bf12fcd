"""The patch series: check, apply in place (touching only what changes), and the git maintenance loop.

Patches are `git format-patch` files applied with `git apply`. The maintenance loop is
`tqgguf patches apply DIR` (one commit per patch on top of a `tqgguf-base` tag), edit and
commit in DIR, then `tqgguf patches export DIR`, which writes the series back deterministically.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import TqError

BASE_TAG = "tqgguf-base"
STATE = ".tqgguf-applied.json"
# Every exported patch carries this author date so that the series does not churn.
FIXED_DATE = "Thu, 1 Jan 2026 00:00:00 +0000"
_IDENT = {
    "GIT_AUTHOR_NAME": "tqgguf", "GIT_AUTHOR_EMAIL": "tqgguf@localhost",
    "GIT_COMMITTER_NAME": "tqgguf", "GIT_COMMITTER_EMAIL": "tqgguf@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}


@dataclass
class PatchInfo:
    name: str
    subject: str
    files: list[str]
    sha256: str


def _git(args: list[str], cwd: Path, env_extra: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # Never let an enclosing repository (e.g. a cache inside a checkout) or user config change the result.
    env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env.update(env_extra or {})
    try:
        r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    except FileNotFoundError:
        raise TqError("git is not installed", "apt-get install git") from None
    if check and r.returncode != 0:
        raise TqError(f"git {args[0]} failed in {cwd}: {_last_error(r.stderr or r.stdout)}")
    return r


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith(("error:", "fatal:"))]
    return (errs[0] if errs else lines[-1] if lines else "unknown error")


_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def touched_files(patch: Path) -> list[str]:
    seen: dict[str, None] = {}
    for a, b in _DIFF_RE.findall(patch.read_text(errors="replace")):
        seen[a] = None
        seen[b] = None
    return list(seen)


def patch_info(patch: Path) -> PatchInfo:
    import hashlib

    text = patch.read_text(errors="replace")
    m = re.search(r"^Subject: (?:\[PATCH[^\]]*\] )?(.*(?:\n [^\n]*)*)", text, re.M)
    subject = " ".join(m.group(1).split()) if m else patch.stem
    return PatchInfo(patch.name, subject, touched_files(patch), hashlib.sha256(patch.read_bytes()).hexdigest())


def _failure(patch: Path, stderr: str) -> TqError:
    m = re.search(r"error: patch failed: (\S+?):(\d+)", stderr) or re.search(r"error: (\S+): (?:No such file|does not exist|already exists)", stderr)
    where = f" at {m.group(1)}" + (f":{m.group(2)}" if m.lastindex and m.lastindex > 1 else "") if m else ""
    return TqError(f"patch {patch.name} does not apply{where}: {_last_error(stderr)}", code=1)


def apply_patches(tree: Path, patches: list[Path]) -> None:
    """`git apply` each patch in order inside `tree` (not a git repository); the first failure is named."""
    for p in patches:
        r = _git(["apply", "--whitespace=nowarn", str(p.resolve())], cwd=tree, check=False)
        if r.returncode != 0:
            raise _failure(p, r.stderr)


def _stage(pristine: Path, patches: list[Path], stage: Path) -> set[str]:
    """Copy the pristine versions of the files the series touches into `stage` and apply it there."""
    touched: set[str] = set()
    for p in patches:
        touched.update(touched_files(p))
    for rel in touched:
        src = pristine / rel
        if src.is_file():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, stage / rel)
    apply_patches(stage, patches)
    return touched


def check_series(pristine: Path, patches: list[Path]) -> list[str]:
    """Apply the series to a clean copy of what it touches; raise naming the first failing patch and file."""
    with tempfile.TemporaryDirectory(prefix="tqgguf-check-") as tmp:
        return sorted(_stage(pristine, patches, Path(tmp)))


def _same(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def ensure_work_tree(pristine: Path, work: Path) -> None:
    """A patchable copy of the pristine tree (copied once, timestamps kept)."""
    if (work / STATE).is_file():
        return
    if work.exists():
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    tmp = work.with_name(work.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(pristine, tmp, symlinks=True,
                    ignore=lambda d, names: _build_dirs(pristine, names) if Path(d) == pristine else set())
    (tmp / STATE).write_text(json.dumps({"touched": [], "series": []}) + "\n")
    os.replace(tmp, work)


def _build_dirs(root: Path, names: list[str]) -> set[str]:
    """The CMake build folders (an in-tree build) among the entries `names` of root: a work tree does not need them."""
    return {n for n in names if (root / n / "CMakeCache.txt").is_file()}


def _entries(root: Path) -> dict[str, os.stat_result]:
    """Every file and symlink under root (relative POSIX path -> lstat), the work tree's state file left out."""
    out: dict[str, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if d == root:
            # git's folder (copied once, for llama.cpp's build info) changes with every commit; no source in it
            skip = _build_dirs(root, dirnames) | {".git"}
            dirnames[:] = [n for n in dirnames if n not in skip]
        for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            rel = (d / name).relative_to(root).as_posix()
            if rel != STATE:
                out[rel] = (d / name).lstat()
    return out


def mirror_tree(pristine: Path, work: Path, skip: set[str]) -> list[str]:
    """Make the files of `work` that are not in `skip` those of `pristine`: copy what is new or differs in size or
    modification time (keeping the pristine timestamp, so an unchanged file is never copied twice) and remove what
    pristine no longer has. For a local source tree, which can change under the same build key; returns the relative
    paths written or removed."""
    src, dst = _entries(pristine), _entries(work)
    changed: list[str] = []
    for rel, st in src.items():
        if rel in skip:
            continue
        cur = dst.get(rel)
        a, b = pristine / rel, work / rel
        if os.path.islink(a):
            if cur is not None and os.path.islink(b) and os.readlink(a) == os.readlink(b):
                continue
            if cur is not None or os.path.islink(b):
                b.unlink()
            b.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(a), b)
        else:
            if cur is not None and not os.path.islink(b) and cur.st_size == st.st_size \
                    and cur.st_mtime_ns == st.st_mtime_ns:
                continue
            if os.path.islink(b):
                b.unlink()
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)
        changed.append(rel)
    for rel in dst.keys() - src.keys() - skip:
        (work / rel).unlink()
        changed.append(rel)
    return sorted(changed)


def sync_series(pristine: Path, work: Path, patches: list[Path], mirror: bool = False) -> list[str]:
    """Bring `work` to pristine + series, writing only files whose content changes.

    Files the previous series touched but the new one does not go back to pristine.
    Unchanged files keep their timestamps, so the build tool rebuilds only what changed.
    With `mirror` (a local source tree, whose files can change while its build key stays), the files the series does
    not touch are brought up to date with pristine too; a verified sdist never changes, so it is copied once.
    Returns the relative paths written or removed.
    """
    ensure_work_tree(pristine, work)
    state = json.loads((work / STATE).read_text())
    old = set(state.get("touched", []))
    changed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tqgguf-stage-") as tmp:
        stage = Path(tmp)
        new = _stage(pristine, patches, stage)
        if mirror:
            changed += mirror_tree(pristine, work, new | old)
        for rel in sorted(new | old):
            want = stage / rel if rel in new else pristine / rel
            cur = work / rel
            if not want.is_file():
                if cur.exists():
                    cur.unlink()
                    changed.append(rel)
                continue
            if cur.is_file() and _same(want, cur):
                continue
            cur.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(want, cur)
            os.chmod(cur, want.stat().st_mode & 0o777)
            changed.append(rel)
    (work / STATE).write_text(json.dumps({"touched": sorted(new), "series": [p.name for p in patches]}, indent=1) + "\n")
    return changed


# ---- the maintenance loop -------------------------------------------------------------------


def init_repo(tree: Path, commit_msg: str) -> None:
    """Make `tree` a git repository whose first commit is the pristine source, tagged tqgguf-base."""
    _git(["init", "-q"], tree)
    _git(["add", "-A", "-f", "."], tree)
    _git(["commit", "-q", "--no-verify", "-m", commit_msg], tree, _IDENT)
    _git(["tag", BASE_TAG], tree)


def am_series(tree: Path, patches: list[Path]) -> None:
    """Apply the series as one commit per patch (git am), on top of the current HEAD."""
    for p in patches:
        r = _git(["am", "-q", "--keep-cr", "--committer-date-is-author-date", str(p.resolve())], tree, _IDENT, check=False)
        if r.returncode != 0:
            _git(["am", "--abort"], tree, check=False)
            raise _failure(p, r.stderr + r.stdout)


def tree_series(tree: Path) -> list[dict]:
    """The commits of a `tqgguf patches apply` tree on top of its base tag, oldest first, numbered as an exported
    series would be: [{"name": "0001 subject", "commit": sha}]."""
    r = _git(["log", "--reverse", "--format=%H%x09%s", f"{BASE_TAG}..HEAD"], tree)
    rows = [ln.split("\t", 1) for ln in r.stdout.splitlines() if ln.strip()]
    return [{"name": f"{i:04d} {subject}", "commit": sha} for i, (sha, subject) in enumerate(rows, 1)]


def export_series(tree: Path, out_dir: Path) -> tuple[list[str], list[str]]:
    """Write tqgguf-base..HEAD of `tree` as a deterministic series into `out_dir`.

    Returns (series names in order, names of files written or removed). Files whose bytes
    do not change are left alone; stale `*.patch` files are removed.
    """
    if _git(["rev-parse", "-q", "--verify", f"refs/tags/{BASE_TAG}"], tree, check=False).returncode != 0:
        raise TqError(f"{tree} has no {BASE_TAG} tag", "create the tree with `tqgguf patches apply DIR` first")
    with tempfile.TemporaryDirectory(prefix="tqgguf-export-") as tmp:
        _git(["-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "diff.algorithm=myers",
              "-c", "diff.renames=true", "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered",
              "--full-index", "-o", tmp, f"{BASE_TAG}..HEAD"], tree)
        names = sorted(p.name for p in Path(tmp).glob("*.patch"))
        touched: list[str] = []
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            text = (Path(tmp) / name).read_text()
            text = re.sub(r"^Date: .*$", f"Date: {FIXED_DATE}", text, count=1, flags=re.M)
            dest = out_dir / name
            if not dest.is_file() or dest.read_text() != text:
                dest.write_text(text)
                touched.append(name)
        for stale in out_dir.glob("*.patch"):
            if stale.name not in names:
                stale.unlink()
                touched.append(stale.name)
    return names, touched
