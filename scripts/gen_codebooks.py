#!/usr/bin/env python3
"""Generate the TurboQuant Lloyd-Max codebooks (turbo2/turbo3/turbo4).

The codebooks quantize one coordinate of a uniformly random unit vector in d = QK_TURBO = 64
dimensions, whose density is

    f(t) = (1 - t^2)^((d-3)/2) / B(1/2, (d-1)/2)      on [-1, 1].

For b = 2, 3, 4 bits (4, 8, 16 levels) we run Lloyd-Max (centroid / midpoint-boundary updates)
to convergence.  The codebooks are symmetric, so the iteration runs on the positive half only with
a fixed boundary at 0; the negative half is the mirror image.

All integrals are computed to (near) machine precision: the cell masses and second moments with
composite Gauss-Legendre quadrature (many panels per cell), the first moments in closed form
(int t (1-t^2)^a dt = -(1-t^2)^(a+1) / (2(a+1))).  Only numpy is needed.

Outputs:
  * JSON (default tqgguf/data/codebooks.json, override with --json PATH): for each b the levels
    (ascending, unit-vector coordinate units), boundaries (midpoints), per-coordinate MSE, the
    relative MSE of a unit vector (d * per-coordinate MSE), the paper's value, iterations, d.
  * C header ggml-turbo-codebooks.h (--header PATH, default stdout) with float32 literals printed
    with %.9g (exact float32 round trip).  The header is byte-for-byte deterministic.
  * GLSL tables turbo_codebooks.glsl for the Vulkan shaders (--glsl PATH): the same literals.
  * --check PATH regenerates the header (the GLSL tables for a .glsl PATH) and exits 1 (printing a
    diff) if PATH differs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from pathlib import Path

import numpy as np

D_DEFAULT = 64
BITS = (2, 3, 4)
# Paper (arXiv 2504.19874), relative MSE for unit vectors.
PAPER_REL_MSE = {1: 0.36, 2: 0.117, 3: 0.030, 4: 0.009}

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO_ROOT / "tqgguf" / "data" / "codebooks.json"

# Composite Gauss-Legendre: PANELS panels per cell, NODES nodes per panel.
DEFAULT_PANELS = 32
DEFAULT_NODES = 24


class _Density:
    """Integrals of the normalized density f(t) = (1-t^2)^a / Z, a = (d-3)/2, over [lo, hi]."""

    def __init__(self, d: int, panels: int = DEFAULT_PANELS, nodes: int = DEFAULT_NODES):
        if d < 3:
            raise ValueError("d must be >= 3")
        self.d = d
        self.a = (d - 3) / 2.0
        # Z = int_{-1}^{1} (1-t^2)^a dt = B(1/2, a+1)
        self.log_z = math.lgamma(0.5) + math.lgamma(self.a + 1.0) - math.lgamma(self.a + 1.5)
        self.z = math.exp(self.log_z)
        x, w = np.polynomial.legendre.leggauss(nodes)
        # Panels on [0, 1]; node positions within [0, 1]
        edges = np.linspace(0.0, 1.0, panels + 1)
        pl, pr = edges[:-1], edges[1:]
        self.s = ((pl[:, None] + pr[:, None]) / 2 + (pr - pl)[:, None] / 2 * x[None, :]).ravel()
        self.ws = ((pr - pl)[:, None] / 2 * w[None, :]).ravel()

    def _pdf(self, t: np.ndarray) -> np.ndarray:
        return np.power(np.clip(1.0 - t * t, 0.0, None), self.a) / self.z

    def _quad(self, lo: np.ndarray, hi: np.ndarray, k: int) -> np.ndarray:
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        t = lo[..., None] + (hi - lo)[..., None] * self.s
        g = self._pdf(t) * t**k
        return (g * self.ws).sum(axis=-1) * (hi - lo)

    def mass(self, lo, hi):
        return self._quad(lo, hi, 0)

    def moment1(self, lo, hi):
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        a1 = self.a + 1.0
        p = lambda t: np.power(np.clip(1.0 - t * t, 0.0, None), a1)  # noqa: E731
        return (p(lo) - p(hi)) / (2.0 * a1 * self.z)

    def moment2(self, lo, hi):
        return self._quad(lo, hi, 2)


def lloyd_max(bits: int, d: int = D_DEFAULT, tol: float = 1e-13, max_iter: int = 200000,
              panels: int = DEFAULT_PANELS, nodes: int = DEFAULT_NODES) -> dict:
    """Symmetric Lloyd-Max codebook with 2**bits levels for the unit-vector coordinate density."""
    dens = _Density(d, panels, nodes)
    m = 2 ** (bits - 1)  # positive levels
    sigma = 1.0 / math.sqrt(d)
    # Start: uniform over (0, 3 sigma]
    c = (np.arange(m, dtype=np.float64) + 0.5) * (3.0 * sigma / m)
    it = 0
    delta = float("inf")
    while it < max_iter:
        it += 1
        b = np.concatenate(([0.0], (c[:-1] + c[1:]) / 2, [1.0]))
        lo, hi = b[:-1], b[1:]
        c_new = dens.moment1(lo, hi) / dens.mass(lo, hi)
        delta = float(np.max(np.abs(c_new - c)))
        c = c_new
        if delta < tol:
            break
    else:
        raise RuntimeError(f"Lloyd-Max b={bits} did not converge (delta={delta:g})")

    b = np.concatenate(([0.0], (c[:-1] + c[1:]) / 2, [1.0]))
    lo, hi = b[:-1], b[1:]
    mass = dens.mass(lo, hi)
    mse_half = float(np.sum(dens.moment2(lo, hi) - 2 * c * dens.moment1(lo, hi) + c * c * mass))
    mse = 2.0 * mse_half  # per coordinate, both halves
    levels = np.concatenate((-c[::-1], c))
    bounds = (levels[:-1] + levels[1:]) / 2
    bounds[m - 1] = 0.0  # exact symmetry
    return {
        "bits": bits,
        "d": d,
        "levels": [float(v) for v in levels],
        "boundaries": [float(v) for v in bounds],
        "mse_per_coord": mse,
        "rel_mse": d * mse,
        "paper_rel_mse": PAPER_REL_MSE[bits],
        "lower_bound_rel_mse": 4.0 ** (-bits),
        "iterations": it,
        "final_delta": delta,
        "total_mass": float(2 * mass.sum()),
    }


def generate(d: int = D_DEFAULT, bits=BITS, panels: int = DEFAULT_PANELS, nodes: int = DEFAULT_NODES,
             tol: float = 1e-13) -> dict:
    cbs = {str(b): lloyd_max(b, d, tol=tol, panels=panels, nodes=nodes) for b in bits}
    return {
        "generator": "scripts/gen_codebooks.py",
        "description": "Lloyd-Max codebooks for one coordinate of a uniformly random unit vector in d dimensions, "
                       "density proportional to (1 - t^2)^((d-3)/2) on [-1, 1]; levels ascending, boundaries are "
                       "midpoints; rel_mse = d * mse_per_coord = E|u - Q(u)|^2 for a unit vector u.",
        "d": d,
        "quadrature": {"panels_per_cell": panels, "gauss_legendre_nodes": nodes, "tol": tol},
        "codebooks": cbs,
    }


def fmt_f32(v: float) -> str:
    """C float literal that round-trips the float32 value of v exactly."""
    f = np.float32(v)
    s = "%.9g" % float(f)
    if np.float32(float(s)) != f:  # pragma: no cover - %.9g always round-trips float32
        raise AssertionError(s)
    if "." not in s and "e" not in s and "n" not in s:
        s += ".0"
    return s + "f"


def _tables(data: dict):
    """(bits, "levels" or "bounds", float32 literals) of every table: each codebook's levels, then its bounds."""
    for key in sorted(data["codebooks"], key=int):
        cb = data["codebooks"][key]
        for kind, vals in (("levels", cb["levels"]), ("bounds", cb["boundaries"])):
            yield cb["bits"], kind, [fmt_f32(v) for v in vals]


def render_header(data: dict) -> str:
    d = data["d"]
    cbs = data["codebooks"]
    out = []
    out.append("// ggml-turbo-codebooks.h - generated by scripts/gen_codebooks.py; do not edit by hand.")
    out.append("//")
    out.append(f"// Lloyd-Max codebooks for one coordinate of a uniformly random unit vector in d = {d} dimensions")
    out.append("// (density proportional to (1 - t^2)^((d-3)/2) on [-1, 1]), in unit-vector coordinate units.")
    out.append("// turboN_bounds are the midpoints of adjacent levels; index = number of bounds b with u > b.")
    out.append("//")
    out.append("// Relative MSE E|u - Q(u)|^2 for a unit vector u (= d * per-coordinate MSE):")
    for key in sorted(cbs, key=int):
        cb = cbs[key]
        out.append(f"//   turbo{cb['bits']} (b={cb['bits']}): {cb['rel_mse']:.6f}"
                   f"   (paper: {cb['paper_rel_mse']:.3f}, lower bound 4^-b: {cb['lower_bound_rel_mse']:.6f})")
    out.append("")
    out.append("#pragma once")
    out.append("")
    out.append(f"#define TURBO_CODEBOOK_D {d}")
    for b, kind, lits in _tables(data):
        if kind == "levels":
            out.append("")
        out.append(f"static const float turbo{b}_{kind}[{len(lits)}] = {{")
        out.extend(_wrap(lits))
        out.append("};")
    out.append("")
    out.append("// The same tables as initializer lists, for backends that keep their own copies")
    out.append("// (CUDA/HIP __device__ arrays): static __device__ const float t[4] = TURBO2_LEVELS_INIT;")
    for b, kind, lits in _tables(data):
        out.append(f"#define TURBO{b}_{kind.upper()}_INIT {{ " + ", ".join(lits) + " }")
    out.append("")
    return "\n".join(out)


def render_glsl(data: dict) -> str:
    """The same float32 tables for the Vulkan shaders (GLSL has no `static`, and its arrays take constructors)."""
    out = []
    out.append("// turbo_codebooks.glsl - generated by scripts/gen_codebooks.py; do not edit by hand.")
    out.append("//")
    out.append("// The Lloyd-Max codebooks of ggml-turbo-codebooks.h (the same float32 values) for the Vulkan shaders:")
    out.append("// value = d * turboN_levels[index]; index = number of turboN_bounds b with u > b.")
    out.append("")
    out.append("#if !defined(GGML_TURBO_CODEBOOKS_GLSL)")
    out.append("#define GGML_TURBO_CODEBOOKS_GLSL")
    for b, kind, lits in _tables(data):
        out.append("")
        out.append(f"const float turbo{b}_{kind}[{len(lits)}] = float[{len(lits)}](")
        lines = _wrap(lits)
        lines[-1] = lines[-1].rstrip(",")
        out.extend(lines)
        out.append(");")
    out.append("")
    out.append("#endif // !defined(GGML_TURBO_CODEBOOKS_GLSL)")
    out.append("")
    return "\n".join(out)


def _wrap(items, per_line: int = 4):
    lines = []
    for i in range(0, len(items), per_line):
        lines.append("    " + ", ".join(items[i:i + per_line]) + ",")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--header", metavar="PATH", help="write the C header here (default: stdout)")
    ap.add_argument("--json", metavar="PATH", default=str(DEFAULT_JSON), help=f"JSON output (default {DEFAULT_JSON})")
    ap.add_argument("--no-json", action="store_true", help="do not write the JSON file")
    ap.add_argument("--glsl", metavar="PATH", help="also write the GLSL tables (turbo_codebooks.glsl) here")
    ap.add_argument("--check", metavar="PATH",
                    help="regenerate the header (or, for a .glsl PATH, the GLSL tables) and compare with PATH; "
                         "exit 1 with a diff if it differs (writes nothing)")
    ap.add_argument("-d", type=int, default=D_DEFAULT, help="dimension (default 64 = QK_TURBO)")
    ap.add_argument("--panels", type=int, default=DEFAULT_PANELS, help="quadrature panels per cell")
    ap.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="Gauss-Legendre nodes per panel")
    args = ap.parse_args(argv)

    data = generate(args.d, BITS, args.panels, args.nodes)
    header = render_header(data)
    glsl = render_glsl(data)

    if args.check:
        path = Path(args.check)
        want = glsl if path.suffix == ".glsl" else header
        try:
            cur = path.read_text()
        except OSError as e:
            print(f"gen_codebooks --check: cannot read {path}: {e}", file=sys.stderr)
            return 1
        if cur != want:
            diff = difflib.unified_diff(cur.splitlines(True), want.splitlines(True),
                                        fromfile=str(path), tofile="regenerated")
            print(f"gen_codebooks --check: {path} differs from the regenerated "
                  f"{'GLSL tables' if want is glsl else 'header'}:", file=sys.stderr)
            sys.stderr.writelines(diff)
            return 1
        print(f"gen_codebooks --check: {path} is up to date", file=sys.stderr)
        return 0

    for key in sorted(data["codebooks"], key=int):
        cb = data["codebooks"][key]
        print(f"b={cb['bits']}: rel MSE {cb['rel_mse']:.6f} (paper {cb['paper_rel_mse']:.3f}), "
              f"per-coord {cb['mse_per_coord']:.6e}, {cb['iterations']} iterations, "
              f"levels {np.array2string(np.array(cb['levels']), precision=6, max_line_width=200)}",
              file=sys.stderr)

    if not args.no_json:
        jp = Path(args.json)
        jp.parent.mkdir(parents=True, exist_ok=True)
        jp.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {jp}", file=sys.stderr)
    if args.glsl:
        gp = Path(args.glsl)
        gp.parent.mkdir(parents=True, exist_ok=True)
        gp.write_text(glsl)
        print(f"wrote {gp}", file=sys.stderr)
    if args.header:
        hp = Path(args.header)
        hp.parent.mkdir(parents=True, exist_ok=True)
        hp.write_text(header)
        print(f"wrote {hp}", file=sys.stderr)
    else:
        sys.stdout.write(header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
