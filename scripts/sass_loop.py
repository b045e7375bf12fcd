#!/usr/bin/env python3
"""Count the SASS instructions of a kernel's innermost loop, by opcode: a GPU-free check of a kernel change.

The decode kernel is limited by the instructions it issues per cache row, so the static count of its main loop
(the smallest backward branch around the tensor-core MMAs) says whether a change cuts work before any device run.
Needs cuobjdump and the nvdisasm it runs, which the machines here lack; PyPI ships both (nvdisasm is looked up
next to cuobjdump, then on PATH):

    pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d /tmp/cuobj
    for w in /tmp/cuobj/*.whl; do unzip -q -o $w -d /tmp/cuobj; done
    cuobjdump=/tmp/cuobj/nvidia/cu13/bin/cuobjdump

Example (an sm_90 object of a compile-check build, the turbo3/turbo3 decode kernel at head size 128, 4 heads):

    python scripts/sass_loop.py --cuobjdump $cuobjdump \\
        build/ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/template-instances/fattn-turbo-instance-turbo3_0-turbo3_0.cu.o \\
        'flash_attn_ext_turbo_mmaILi128ELi4E'
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

INSN = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)$")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """{mangled name: [(address, instruction)]} from `cuobjdump -sass` output."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def main_loop(insns: list[tuple[int, str]], marker: str) -> list[tuple[int, str]]:
    """The smallest backward-branch body that contains `marker` (an opcode such as HMMA)."""
    best: list[tuple[int, str]] = []
    for addr, text in insns:
        m = BRANCH.search(text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        body = [(a, t) for a, t in insns if int(m.group(1), 16) <= a <= addr]
        if any(marker in t for _, t in body) and (not best or len(body) < len(best)):
            best = body
    return best


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("object", help="a CUDA object file (.o) or cubin")
    ap.add_argument("kernel", help="a substring of the kernel's mangled name; must match exactly one function")
    ap.add_argument("--cuobjdump", default="cuobjdump", help="path of cuobjdump (default: from PATH)")
    ap.add_argument("--marker", default="HMMA", help="an opcode the loop contains (default: HMMA)")
    ap.add_argument("--list", action="store_true", help="print the loop's instructions too")
    args = ap.parse_args()

    try:
        # cuobjdump runs nvdisasm from PATH: the one beside it (the PyPI wheels unpack into the same bin/) first
        env = dict(os.environ)
        here = os.path.dirname(shutil.which(args.cuobjdump) or args.cuobjdump)
        env["PATH"] = os.pathsep.join(p for p in (here, env.get("PATH", "")) if p)
        sass = subprocess.run([args.cuobjdump, "-sass", args.object], check=True, capture_output=True,
                              text=True, env=env).stdout
    except FileNotFoundError:
        print(f"error: {args.cuobjdump} not found (see --help for where to get cuobjdump)", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        hint = " (see --help for where to get nvdisasm)" if "nvdisasm" in e.stderr else ""
        print(f"error: cuobjdump failed: {e.stderr.strip()}{hint}", file=sys.stderr)
        return 2

    matches = {name: insns for name, insns in functions(sass).items() if args.kernel in name}
    if len(matches) != 1:
        print(f"error: {len(matches)} functions match {args.kernel!r}" +
              "".join(f"\n  {name}" for name in matches), file=sys.stderr)
        return 1
    (name, insns), = matches.items()
    loop = main_loop(insns, args.marker)
    if not loop:
        print(f"error: no loop with {args.marker} in {name}", file=sys.stderr)
        return 1
    counts = collections.Counter(opcode(t) for _, t in loop)
    print(f"{name}\n{len(insns)} instructions, main loop {len(loop)} "
          f"(0x{loop[0][0]:x}-0x{loop[-1][0]:x}; both sides of its branches)")
    print(" ".join(f"{op}:{n}" for op, n in counts.most_common()))
    # ptxas puts never-executed placeholders (`@!PT LDS RZ, [RZ]`) next to cp.async copies; they are in the counts
    never = collections.Counter(opcode(t) for _, t in loop if t.startswith("@!PT "))
    if never:
        print("of them never executed (@!PT): " + " ".join(f"{op}:{n}" for op, n in never.most_common()))
    if args.list:
        for addr, text in loop:
            print(f"{addr:#06x}  {text}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the listing piped into head and the like
        sys.stderr.close()
        sys.exit(0)
