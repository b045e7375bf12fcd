"""Progress from build-tool output: Ninja's `[n/m]` and Make's `[ p%]` lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
_MAKE = re.compile(r"^\[\s*(\d+)%\]\s*(.*)$")


@dataclass
class Step:
    done: int
    total: int
    what: str


def parse_line(line: str) -> Step | None:
    """One line of build output as a step, or None. Make's percentages become done/100."""
    line = line.rstrip("\r\n")
    m = _NINJA.match(line)
    if m:
        return Step(int(m.group(1)), int(m.group(2)), _short(m.group(3)))
    m = _MAKE.match(line)
    if m:
        return Step(int(m.group(1)), 100, _short(m.group(2)))
    return None


def _short(what: str) -> str:
    """'Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o' -> 'llama-model.cpp'."""
    m = re.search(r"(?:object|Linking \w+ (?:executable|shared library|static library))\s+(\S+)", what)
    if m:
        name = m.group(1).rsplit("/", 1)[-1]
        return name.removesuffix(".o")
    return what[:60]


_ERR = re.compile(r"(\berror\b|FAILED:|Error \d+|undefined reference|fatal)", re.I)


def error_lines(log: str, n: int = 15) -> list[str]:
    """The first lines that look like errors (compilers print the cause first), at most n. A CMake error's header
    comes with its message (the next non-empty line); git's complaints while llama.cpp's CMake looks for its build
    info in a tree without .git are no error."""
    lines = log.splitlines()
    out: list[str] = []
    for i, ln in enumerate(lines):
        if not _ERR.search(ln) or "-Werror" in ln or "warning" in ln.lower() or "not a git repository" in ln:
            continue
        if ln.startswith("CMake Error"):
            nxt = next((m.strip() for m in lines[i + 1:i + 4] if m.strip()), "")
            ln = f"{ln.rstrip(':')}: {nxt}" if nxt else ln
        if ln not in out:
            out.append(ln)
    return out[:n]
