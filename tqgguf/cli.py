"""The `tqgguf` command line."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .errors import EXIT_ERROR, TqError

app = typer.Typer(
    name="tqgguf",
    help="TurboQuant KV-cache compression for llama.cpp: pinned source, patch series, builds and GGUF tools.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    add_completion=False,
)
patches_app = typer.Typer(help="List, check, apply and export the patch series.", no_args_is_help=True)
app.add_typer(patches_app, name="patches")

# soft_wrap: lines longer than the terminal are left to it to wrap, not broken at 80 columns where output goes to a
# pipe or a log (a path cut in two cannot be copied); tables still fit the width
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _cli(fn):
    """Turn TqError into one line on stderr and its exit code; Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*a, **k):
        try:
            return fn(*a, **k)
        except TqError as e:
            err.print(f"[bold red]error:[/] {e.message}", highlight=False, markup=True, soft_wrap=True)
            if e.hint:
                err.print(f"  hint: {e.hint}", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(e.code)
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130)

    return wrapper


def _log(msg: str) -> None:
    from rich.markup import escape

    err.print(f"[dim]{escape(msg)}[/]", highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"tqgguf {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    pass


SourceOpt = Annotated[Optional[Path], typer.Option("--source", help="Use this local llama.cpp tree instead of the pinned sdist.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
BinDirOpt = Annotated[Optional[Path], typer.Option("--bin-dir", help="Folder with the built llama.cpp tools (default: $TQGGUF_BIN_DIR, else tqgguf's build).")]


def _use_bin_dir(bin_dir: Path) -> None:
    """--bin-dir for the commands that find llama-server through $TQGGUF_BIN_DIR (serve, niah)."""
    import os

    from .runinfo import BIN_DIR_ENV

    os.environ[BIN_DIR_ENV] = str(bin_dir.expanduser().resolve())


def _pin():
    from .pin import load_pin

    return load_pin()


@app.command()
@_cli
def source(source: SourceOpt = None, as_json: JsonOpt = False) -> None:
    """Get the pinned llama.cpp source (verified by sha256, cached) and print its path.

    Examples:

        tqgguf source

        tqgguf source --json
    """
    from .source import resolve_source

    src = resolve_source(_pin(), source, _log)
    if as_json:
        print(json.dumps(src.to_dict(), indent=1))
    else:
        print(src.root)


# ---- patches -------------------------------------------------------------------------------


@patches_app.command("list")
@_cli
def patches_list(as_json: JsonOpt = False) -> None:
    """List the series in order, with the files each patch touches."""
    from .patches import patch_info

    pin = _pin()
    infos = [patch_info(p) for p in pin.patch_paths]
    if as_json:
        print(json.dumps([i.__dict__ for i in infos], indent=1))
        return
    if not infos:
        out.print("the series is empty")
    for i in infos:
        out.print(f"[bold]{i.name}[/]  {i.subject}", highlight=False)
        out.print(f"    {len(i.files)} file(s): {', '.join(i.files[:6])}{' ...' if len(i.files) > 6 else ''}", highlight=False)


@patches_app.command("check")
@_cli
def patches_check(source: SourceOpt = None) -> None:
    """Apply the series to a clean copy of the source; name the first failing patch and file.

    Exit code 0 when every patch applies, 1 when one does not, 2 on bad input.
    """
    from .patches import check_series
    from .source import resolve_source

    pin = _pin()
    src = resolve_source(pin, source, _log)
    files = check_series(src.root, pin.patch_paths)
    out.print(f"ok: {len(pin.series)} patch(es) apply cleanly to {src.kind} source {src.commit} ({len(files)} files)")


@patches_app.command("apply")
@_cli
def patches_apply(
    directory: Annotated[Path, typer.Argument(help="Destination: a new folder, or an existing clean git tree of the source.")],
    source: SourceOpt = None,
    no_git: Annotated[bool, typer.Option("--no-git", help="Copy and patch only; make no git commits.")] = False,
) -> None:
    """Apply the series to DIR, one git commit per patch, for editing.

    The maintenance loop: `tqgguf patches apply ~/tq-src`, edit and `git commit` there (a new commit
    for a new patch, `git commit --fixup`/rebase to change one), then `tqgguf patches export ~/tq-src`.

    Examples:

        tqgguf patches apply /tmp/llama-tq
    """
    import shutil

    from .patches import am_series, apply_patches, init_repo
    from .source import resolve_source

    pin = _pin()
    directory = directory.expanduser().resolve()
    if directory.exists() and any(directory.iterdir()):
        if not (directory / ".git").exists():
            raise TqError(f"{directory} exists and is not empty", "give a new folder, or a git tree of the source")
        if no_git:
            raise TqError("--no-git needs a new folder")
    else:
        src = resolve_source(pin, source, _log)
        _log(f"copying {src.root} to {directory} ...")
        if directory.exists():
            directory.rmdir()
        shutil.copytree(src.root, directory, symlinks=True,
                        ignore=shutil.ignore_patterns(".tqgguf-source.json", ".git"))
        if no_git:
            apply_patches(directory, pin.patch_paths)
            out.print(f"applied {len(pin.series)} patch(es) to {directory}")
            return
        init_repo(directory, f"upstream llama.cpp {src.commit} ({src.kind} {src.version or src.root})")
    am_series(directory, pin.patch_paths)
    out.print(f"applied {len(pin.series)} patch(es) to {directory} as commits on tag tqgguf-base")


@patches_app.command("export")
@_cli
def patches_export(
    directory: Annotated[Path, typer.Argument(help="A git tree made by `tqgguf patches apply`.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Export into a temporary folder and report only.")] = False,
) -> None:
    """Regenerate the series from the commits on top of tqgguf-base in DIR and update source.toml."""
    import tempfile

    from .patches import export_series
    from .pin import write_series

    pin = _pin()
    assert pin.path is not None
    directory = directory.expanduser().resolve()
    if not (directory / ".git").exists():
        raise TqError(f"{directory} is not a git tree", "create it with `tqgguf patches apply DIR`")
    if dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            names, _ = export_series(directory, Path(tmp))
        out.print(f"would export {len(names)} patch(es): {', '.join(names)}")
        return
    names, touched = export_series(directory, pin.path.parent)
    write_series(pin.path, names)
    out.print(f"exported {len(names)} patch(es); {len(touched)} file(s) changed" +
              (f": {', '.join(touched)}" if touched else ""))


# ---- build ---------------------------------------------------------------------------------


@app.command()
@_cli
def build(
    backend: Annotated[list[str], typer.Option("--backend", "-b", help="cpu, cuda, hip, vulkan or metal; repeatable.")] = ["cpu"],
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="Parallel build jobs (default: all cores).")] = None,
    cuda_arch: Annotated[Optional[str], typer.Option("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES, e.g. 90, or 90-real for the GPU code alone (shorter build; no PTX for newer GPUs to compile at load) (default: native).")] = None,
    cuda_compression: Annotated[str, typer.Option("--cuda-compression", help="nvcc fatbinary compression (GGML_CUDA_COMPRESSION_MODE): none, speed, balance or size (upstream's default; smaller, slower to build).")] = "none",
    hip_arch: Annotated[Optional[str], typer.Option("--hip-arch", help="GPU_TARGETS for HIP, e.g. gfx1100.")] = None,
    targets: Annotated[Optional[str], typer.Option("--targets", help="Comma-separated CMake targets (default: the tools tqgguf drives).")] = None,
    build_type: Annotated[str, typer.Option("--build-type", help="CMake build type.")] = "Release",
    native: Annotated[bool, typer.Option("--native/--no-native", help="Optimize for this CPU (GGML_NATIVE).")] = True,
    print_bin: Annotated[Optional[str], typer.Option("--print-bin", help="Print the path of a built binary and exit (no build).")] = None,
    python: Annotated[bool, typer.Option("--python", help="Also install llama-cpp-python bound to this build (no second compile).")] = False,
    source: SourceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Patch and build llama.cpp offline; an unchanged build is a no-op.

    Examples:

        tqgguf build                         # CPU

        tqgguf build -b cuda --cuda-arch 90-real -j16

        $(tqgguf build --print-bin llama-server) --help
    """
    from .build import DEFAULT_TARGETS, BuildSpec, find_bin, run_build
    from .source import cached_pinned_source, resolve_source

    pin = _pin()
    tlist = [t.strip() for t in targets.split(",") if t.strip()] if targets else list(DEFAULT_TARGETS)
    spec = BuildSpec(backends=backend, build_type=build_type, cuda_arch=cuda_arch,
                     cuda_compression=cuda_compression, hip_arch=hip_arch,
                     native=native, targets=tlist)
    if "cuda" in spec.backends and cuda_arch is None and not print_bin:
        from .gpu import cuda_archs

        if not cuda_archs():
            raise TqError("-b cuda without --cuda-arch builds for this machine's GPUs (CMake's native), and nvidia-smi "
                          "lists none", "pass --cuda-arch: 90 for H100/H200, 89 for RTX 40xx/L4, 86 for RTX 30xx, "
                          "80 for A100, or native to let CMake look", code=2)
    if print_bin:
        src = resolve_source(pin, source) if source else cached_pinned_source(pin)
        if src is None:
            raise TqError("the pinned source has not been fetched", "run `tqgguf build` first")
        print(find_bin(src, spec, print_bin))
        return
    src = resolve_source(pin, source, _log)
    with Progress(TextColumn("[bold]build"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=True) as progress:
        task = progress.add_task("", total=None)

        def on_progress(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=what)

        res = run_build(src, pin, spec, jobs, on_progress, _log)
    m = res.manifest
    if python:
        from .bindings import install_bindings
        from .build import work_tree

        m["python_bindings"] = install_bindings(pin, work_tree(src), res.bin_dir, _log)
    if as_json:
        print(json.dumps(m, indent=1))
        return
    what = "nothing to rebuild" if res.steps == 0 else f"{res.steps} build step(s)"
    out.print(f"built {'+'.join(spec.backends)} in {m['duration_s']} s ({what}; {len(res.changed_files)} source file(s) changed)")
    out.print(f"binaries: {res.bin_dir}", highlight=False)
    out.print(f"manifest: {res.bin_dir / 'tqgguf-manifest.json'}", highlight=False)
    if src.kind == "local":
        out.print(f"this build is of {src.root}: pass --bin-dir {res.bin_dir} to serve, ppl, bench and niah "
                  f"(or export TQGGUF_BIN_DIR={res.bin_dir})", highlight=False, soft_wrap=True)
    if python:
        out.print(f"python: llama-cpp-python {m['python_bindings']} installed in {sys.prefix}, using {res.bin_dir}", highlight=False)


# ---- doctor ---------------------------------------------------------------------------------


@app.command()
@_cli
def doctor(as_json: JsonOpt = False) -> None:
    """Which toolchains are here, which backends can be built, and what fixes each gap."""
    from .doctor import format_report, run_doctor

    report = run_doctor()
    if as_json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(format_report(report))


# ---- synth ----------------------------------------------------------------------------------


@app.command()
@_cli
def synth(
    out_path: Annotated[Optional[Path], typer.Option("-o", "--out", help="Output GGUF file (required unless --list-presets).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="A named shape (see --list-presets).")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers")] = None,
    n_embd: Annotated[Optional[int], typer.Option("--n-embd")] = None,
    n_head: Annotated[Optional[int], typer.Option("--n-head")] = None,
    n_head_kv: Annotated[Optional[int], typer.Option("--n-head-kv")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim")] = None,
    n_ff: Annotated[Optional[int], typer.Option("--n-ff")] = None,
    sliding_window: Annotated[Optional[int], typer.Option("--sliding-window", help="Sliding-window size (gemma3 architecture).")] = None,
    swa_pattern: Annotated[Optional[int], typer.Option("--swa-pattern", help="Every P-th layer is full attention.")] = None,
    weights: Annotated[str, typer.Option("--weights", help="q4_0, q8_0, f16 or f32.")] = "q8_0",
    vocab: Annotated[str, typer.Option("--vocab", help="Tokenizer: models/ggml-vocab-NAME.gguf of the pinned tree.")] = "llama-bpe",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    fast: Annotated[bool, typer.Option("--fast", help="Random q4_0/q8_0 codes instead of quantized floats "
                                       "(same std, ~20x faster; for speed runs on large shapes).")] = False,
    list_presets: Annotated[bool, typer.Option("--list-presets", help="List the presets and exit.")] = False,
    source: SourceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a random-weight GGUF with a real tokenizer, for shapes no small real model has.

    Examples:

        tqgguf synth -o /tmp/l3-8b.gguf --preset llama3-8b --weights q4_0 --fast

        tqgguf synth -o /tmp/gqa8.gguf --layers 4 --n-embd 1024 --n-head 16 --n-head-kv 2 --head-dim 128

        tqgguf synth -o /tmp/swa.gguf --preset tiny-swa

        tqgguf synth --list-presets
    """
    import dataclasses

    from .source import resolve_source
    from .synth import PRESETS, SynthShape, find_vocab
    from .synth import synth as write_model

    if list_presets:
        if as_json:
            print(json.dumps({name: dataclasses.asdict(sh) for name, sh in PRESETS.items()}, indent=1))
            return
        table = Table("preset", "layers", "n_embd", "heads", "KV heads", "head dim", "n_ff", "SWA window",
                      box=None, header_style="bold")
        for name, sh in PRESETS.items():
            swa = f"{sh.sliding_window} (1 in {sh.pattern} full)" if sh.sliding_window else "-"
            table.add_row(name, str(sh.n_layer), str(sh.n_embd), str(sh.n_head), str(sh.n_head_kv),
                          str(sh.head_dim), str(sh.ff), swa)
        out.print(table)
        return
    if out_path is None:
        raise TqError("give the output file with -o/--out", "or --list-presets to see the named shapes")
    custom = {"n_layer": layers, "n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv, "head_dim": head_dim,
              "n_ff": n_ff, "sliding_window": sliding_window, "swa_pattern": swa_pattern}
    given = {k: v for k, v in custom.items() if v is not None}
    if preset:
        if preset not in PRESETS:
            raise TqError(f"unknown preset {preset!r}", f"choose from {', '.join(PRESETS)}")
        shape = dataclasses.replace(PRESETS[preset], **given)
    else:
        missing = [f"--{k.replace('_', '-').replace('n-layer', 'layers')}" for k in
                   ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim") if k not in given]
        if missing:
            raise TqError(f"give --preset or all of the shape options (missing: {', '.join(missing)})")
        shape = SynthShape(**given)
    try:
        src = resolve_source(_pin(), source, _log)
        vocab_path = find_vocab(src.root, vocab)
        with Progress(TextColumn("[bold]synth"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=err, transient=True) as progress:
            task = progress.add_task("", total=None)
            info = write_model(out_path, shape, vocab_path, weights=weights, seed=seed, fast=fast,
                               progress=lambda i, n, name: progress.update(task, completed=i, total=n, description=name))
    except ValueError as e:
        raise TqError(str(e)) from None
    if as_json:
        d = dataclasses.asdict(info)
        print(json.dumps(d, indent=1, default=str))
        return
    out.print(f"wrote {info.path} ({info.arch}, {info.n_params / 1e6:.1f} M params, "
              f"{info.file_size / 2**20:.1f} MiB, {info.weights} weights, vocab {info.vocab.name})", highlight=False)


# ---- GGUF tools: check, convert, quantize (issue 4) -----------------------------------------


def _size_opt(text: str | None, what: str) -> int | None:
    from .check_report import parse_size

    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise TqError(f"{what}: {e}") from None


@app.command()
@_cli
def check(
    model: Annotated[Path, typer.Argument(help="A GGUF model file.")],
    ctx: Annotated[Optional[int], typer.Option("--ctx", "-c", help="Context (-c) to size the KV cache for (default: the model's training context, like llama-server's -c 0).")] = None,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="Parallel sequences / server slots.")] = 4,
    unified: Annotated[bool, typer.Option("--unified/--no-unified", help="One KV cache shared by all slots (llama-server's default) or one stream per slot.")] = True,
    batch: Annotated[int, typer.Option("--batch", "-b", help="-b of llama.cpp.")] = 2048,
    ubatch: Annotated[int, typer.Option("--ubatch", "-ub", help="-ub of llama.cpp (sizes sliding-window caches).")] = 512,
    flash_attn: Annotated[bool, typer.Option("--fa/--no-fa", help="Flash attention (turbo types and a quantized V need it).")] = True,
    config: Annotated[Optional[list[str]], typer.Option("--config", help="K/V config to size, e.g. q8_0/turbo4 or turbo4/turbo2+bv2 (the boundary-layer V policy); repeatable (default: a standard set).")] = None,
    mem: Annotated[Optional[str], typer.Option("--mem", help="Memory budget for the fit, e.g. 24GiB.")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="Use the free memory of the first visible NVIDIA GPU as the budget.")] = False,
    margin: Annotated[Optional[str], typer.Option("--margin", help="Compute margin for the fit (default: estimated from the model).")] = None,
    fit: Annotated[str, typer.Option("--fit", help="What to maximize: ctx (largest -c) or slots (most slots of --ctx tokens).")] = "ctx",
    as_json: JsonOpt = False,
) -> None:
    """Check a GGUF before launching: integrity, KV-cache layout, turbo/q8_0/q4_0 verdicts, KV memory, fit.

    Exit codes: 0 usable, 1 usable with warnings, 2 unreadable or unsupported.

    Examples:

        tqgguf check model.gguf

        tqgguf check model.gguf --ctx 32768 --parallel 1 --mem 24GiB

        tqgguf check model.gguf --ctx 8192 --gpu --fit slots --json

        tqgguf check model.gguf --ctx 32768 --config turbo3 --config turbo4/turbo2+bv2
    """
    from .check_report import DEFAULT_CONFIGS, CheckOptions, build_report, error_report, format_text
    from .gguf_read import GgufError
    from .perplexity import CacheConfig

    if fit not in ("ctx", "slots"):
        raise TqError(f"--fit must be ctx or slots, got {fit!r}")
    if not 1 <= parallel <= 256:
        raise TqError(f"--parallel must be in 1..256, got {parallel}")
    if (ctx is not None and ctx < 0) or batch < 1 or ubatch < 1:
        raise TqError("--ctx, --batch and --ubatch must be positive")
    configs = tuple(config) if config else DEFAULT_CONFIGS
    for c in configs:
        CacheConfig.parse(c)          # unknown types and bad +bvN suffixes: one line, exit 2
    budget, source = _size_opt(mem, "--mem"), "--mem"
    if gpu:
        from .gpu import gpu_free

        budget, source = gpu_free()
    opts = CheckOptions(ctx=ctx, parallel=parallel, unified=unified, n_batch=batch, n_ubatch=ubatch,
                        flash_attn=flash_attn, configs=configs, mem=budget, mem_source=source if budget else "",
                        margin=_size_opt(margin, "--margin"), fit=fit)
    try:
        report = build_report(model, opts)
    except GgufError as e:
        if as_json:
            print(json.dumps(error_report(model, str(e)), indent=1))
            raise typer.Exit(2)
        raise TqError(f"{model}: {e}") from None
    except OSError as e:
        raise TqError(f"cannot read {model}: {e.strerror or e}") from None
    print(json.dumps(report, indent=1) if as_json else format_text(report))
    raise typer.Exit(report["exit_code"])


@app.command()
@_cli
def convert(
    hf_dir: Annotated[Path, typer.Argument(help="A Hugging Face model folder (config.json, weights, tokenizer).")],
    out_path: Annotated[Path, typer.Option("-o", "--out", help="Output GGUF file.")],
    outtype: Annotated[str, typer.Option("--outtype", help="f16, bf16 or q8_0 (also f32, auto).")] = "f16",
    source: SourceOpt = None,
) -> None:
    """Convert a Hugging Face model folder to GGUF with the pinned convert_hf_to_gguf.py (offline).

    Needs the `convert` extra (torch, transformers, sentencepiece, safetensors): pip install 'tqgguf[convert]'.

    Examples:

        tqgguf convert ~/models/SmolLM2-135M -o /tmp/smol-f16.gguf

        tqgguf convert ./my-llama --outtype q8_0 -o my-llama-q8_0.gguf
    """
    from .convert import convert as run_convert
    from .convert import preflight
    from .gguf_read import read_gguf
    from .source import resolve_source

    preflight(hf_dir.expanduser(), outtype)
    src = resolve_source(_pin(), source, _log)
    path = run_convert(hf_dir, out_path, outtype, src.root, _log)
    g = read_gguf(path)
    out.print(f"wrote {path} ({g.kv.get('general.architecture', '?')}, {len(g.tensors)} tensors, "
              f"{g.file_size / 2**20:.1f} MiB, {outtype})", highlight=False)


@app.command()
@_cli
def quantize(
    in_path: Annotated[Path, typer.Argument(help="Input GGUF (f32/f16/bf16, or quantized with --allow-requantize).")],
    out_path: Annotated[Path, typer.Argument(help="Output GGUF.")],
    qtype: Annotated[str, typer.Argument(help="Weight type, e.g. Q4_K_M, Q8_0, Q4_0 (see llama-quantize --help).")],
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="Threads (default: all).")] = None,
    allow_requantize: Annotated[bool, typer.Option("--allow-requantize", help="Allow an already quantized input.")] = False,
    backend: Annotated[str, typer.Option("--backend", "-b", help="Which build's llama-quantize to use.")] = "cpu",
    bin_dir: Annotated[Optional[Path], typer.Option("--bin-dir", help="Folder with a built llama-quantize (default: tqgguf's build).")] = None,
    source: SourceOpt = None,
) -> None:
    """Quantize a GGUF's weights with the built llama-quantize.

    Examples:

        tqgguf quantize model-f16.gguf model-Q4_K_M.gguf Q4_K_M
    """
    from .build import BuildSpec, exe_name, find_bin
    from .quantize import quantize as run_quantize
    from .source import cached_pinned_source, resolve_source

    if bin_dir is not None:
        binary = bin_dir / exe_name("llama-quantize")
        if not binary.is_file():
            raise TqError(f"no llama-quantize in {bin_dir}")
    else:
        src = resolve_source(_pin(), source) if source else cached_pinned_source(_pin())
        if src is None:
            raise TqError("llama.cpp has not been built", "run `tqgguf build` first")
        binary = find_bin(src, BuildSpec(backends=[backend]), "llama-quantize")
    size_in = in_path.stat().st_size if in_path.is_file() else 0
    path = run_quantize(binary, in_path, out_path, qtype, threads, ["--allow-requantize"] if allow_requantize else [])
    out.print(f"wrote {path} ({qtype}, {size_in / 2**20:.1f} -> {path.stat().st_size / 2**20:.1f} MiB)",
              highlight=False)


# ---- end of GGUF tools -----------------------------------------------------------------------


# ---- serve (issue 5) -------------------------------------------------------------------------


@app.command(context_settings={"allow_extra_args": True})
@_cli
def serve(
    context: typer.Context,
    model: Annotated[Path, typer.Option("-m", "--model", help="The GGUF model to serve.")],
    cache_type_k: Annotated[Optional[str], typer.Option("--cache-type-k", "-ctk", help="K cache type (default: f16, or the --policy's).")] = None,
    cache_type_v: Annotated[Optional[str], typer.Option("--cache-type-v", "-ctv", help="V cache type (default: f16, or the --policy's).")] = None,
    boundary_v: Annotated[Optional[int], typer.Option("--boundary-v", help="Keep the V cache of the first and last N KV-bearing layers at --boundary-v-type (default: 2 when V is turbo2, else 0; 0 turns it off). Only ever raises precision.")] = None,
    boundary_v_type: Annotated[Optional[str], typer.Option("--boundary-v-type", help="V type of the boundary layers (default: q8_0).")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="A measured preset of K, V and boundary: quality, balanced or compact (explicit flags win).")] = None,
    ctx_size: Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="Context size (llama-server's -c; default: the model's).")] = None,
    parallel: Annotated[Optional[int], typer.Option("-np", "--parallel", help="Server slots (llama-server's -np).")] = None,
    n_gpu_layers: Annotated[Optional[str], typer.Option("-ngl", "--n-gpu-layers", help="Layers on the GPU (llama-server's -ngl).")] = None,
    flash_attn: Annotated[Optional[str], typer.Option("-fa", "--flash-attn", help="on, off or auto (llama-server's -fa; default: on, which turbo types need).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind; anything but loopback needs --api-key.")] = "127.0.0.1",
    port: Annotated[str, typer.Option("--port", help="Port, or auto for a free one.")] = "8080",
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="API key clients must send (passed to llama-server by environment).", envvar="TQGGUF_API_KEY")] = None,
    allow_fallback: Annotated[bool, typer.Option("--allow-fallback", help="Serve even when llama.cpp uses other cache types, or attention runs off the layer's device.")] = False,
    log_file: Annotated[Optional[Path], typer.Option("--log-file", help="Server log (default: a new file under the tqgguf cache).")] = None,
    backend: Annotated[list[str], typer.Option("--backend", "-b", help="Which tqgguf build to run (cpu, cuda, ...; as given to `tqgguf build`).")] = ["cpu"],
    bin_dir: BinDirOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the model to load.")] = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Run the patched llama-server with asymmetric K/V cache types and the boundary-layer V policy.

    Checks the request first (like `tqgguf check`), starts llama-server with its log in a file, waits while the
    model loads, then verifies from the log what llama.cpp really uses (K/V types per layer, flash attention and
    where it runs) and prints the URL. Ctrl-C or SIGTERM stops the server's whole process group. Arguments after
    `--` go to llama-server unchanged.

    Exit codes: 0 stopped by a signal, 1 the server failed or runs something else than requested, 2 bad input.

    Examples:

        tqgguf serve -m model.gguf --cache-type-k turbo4 --cache-type-v turbo2

        tqgguf serve -m model.gguf --policy compact --port auto --json

        tqgguf serve -m model.gguf -ctk q8_0 -ctv turbo3 -c 32768 -np 4 -- -t 8
    """
    from rich.markup import escape

    from .serve import Ui, describe, make_request, run_serve

    extra = _extra_args(context, "llama-server")
    if flash_attn is not None:
        if flash_attn not in ("on", "off", "auto"):
            raise TqError(f"-fa must be on, off or auto, got {flash_attn!r}")
        if any(a.split("=", 1)[0] in ("-fa", "--flash-attn") for a in extra):
            raise TqError("-fa is given twice (before and after --)", "keep one")
        extra = ["-fa", flash_attn, *extra]
    for name, val in (("-c", ctx_size), ("-np", parallel)):
        if val is not None and val < (0 if name == "-c" else 1):
            raise TqError(f"{name} must be {'>= 0' if name == '-c' else '>= 1'}, got {val}")
    if bin_dir is not None:
        _use_bin_dir(bin_dir)
    req = make_request(model.expanduser(), cache_type_k, cache_type_v, boundary_v, boundary_v_type, policy,
                       ctx=ctx_size, parallel=parallel, n_gpu_layers=n_gpu_layers, host=host, port=port,
                       api_key=api_key, extra=extra, allow_fallback=allow_fallback,
                       log_file=log_file.expanduser().resolve() if log_file else None, backends=backend,
                       startup_timeout=timeout)
    ui = Ui(status=lambda msg: err.status(msg, spinner="dots"),
            info=lambda msg: err.print(msg, highlight=False, markup=False, soft_wrap=True),
            warn=lambda msg: err.print(f"[bold yellow]warning:[/] {escape(msg)}", highlight=False, soft_wrap=True))

    def on_ready(running) -> None:
        if as_json:
            print(json.dumps(running.to_dict()), flush=True)
        else:
            for line in describe(running):
                out.print(line, highlight=False, soft_wrap=True)
            out.print("Ctrl-C stops the server.", highlight=False)
            sys.stdout.flush()

    code = run_serve(req, ui, on_ready)
    err.print("stopped llama-server", highlight=False)
    raise typer.Exit(code)


# ---- end of serve ----------------------------------------------------------------------------


# ---- sweeps: ppl, bench, niah (issue 6) -------------------------------------------------------

from .bench_sweep import DEFAULT_CONFIGS as BENCH_CONFIGS  # noqa: E402 (light modules: defaults shown in --help)
from .niah import DEFAULT_CONFIGS as NIAH_CONFIGS  # noqa: E402
from .ppl_sweep import DEFAULT_CONFIGS as PPL_CONFIGS  # noqa: E402

BackendOpt = Annotated[list[str], typer.Option("--backend", "-b", help="Which tqgguf build to use (cpu, cuda, ...; as given to `tqgguf build`).")]
PlotOpt = Annotated[bool, typer.Option("--plot", help="Also write a PNG (needs the plot extra: pip install 'tqgguf[plot]').")]


# flags of the llama.cpp tools that tqgguf sets itself (passed after --, the tool would take the later one and run
# something else than asked, or tqgguf could no longer read its log): the tqgguf option to use instead
_CACHE_FLAGS = {"-ctk": "-ctk", "--cache-type-k": "-ctk", "-ctv": "-ctv", "--cache-type-v": "-ctv",
                "--cache-boundary-layers": "--boundary-v", "--cache-type-v-boundary": "--boundary-v-type"}
_OWNED = {
    "llama-server": {**_CACHE_FLAGS, "-m": "-m", "--model": "-m", "-c": "-c", "--ctx-size": "-c", "-np": "-np",
                     "--parallel": "-np", "-ngl": "-ngl", "--gpu-layers": "-ngl", "--n-gpu-layers": "-ngl",
                     "--host": "--host", "--port": "--port", "--api-key": "--api-key", "-lv": None,
                     "--verbosity": None, "--log-verbosity": None},
    "llama-perplexity": {**_CACHE_FLAGS, "-m": "-m", "--model": "-m", "-f": "-f", "--file": "-f", "-c": "-c",
                         "--ctx-size": "-c", "--chunks": "--chunks", "-ngl": "-ngl", "--gpu-layers": "-ngl",
                         "--n-gpu-layers": "-ngl", "--kl-divergence": None, "--kl-divergence-base": None},
    "llama-bench": {**_CACHE_FLAGS, "-m": "-m", "--model": "-m", "-p": "-p", "--n-prompt": "-p", "-n": "-n",
                    "--n-gen": "-n", "-d": "--depth", "--n-depth": "--depth", "-r": "-r", "--repetitions": "-r",
                    "-ngl": "-ngl", "--n-gpu-layers": "-ngl", "-o": None, "--output": None, "-fa": None,
                    "--flash-attn": None},
    "llama-batched-bench": {**_CACHE_FLAGS, "-m": "-m", "--model": "-m", "-c": "-c", "--ctx-size": "-c",
                            "-npl": "--npl", "-npp": "-p", "-ntg": "-n", "-ngl": "-ngl", "--gpu-layers": "-ngl",
                            "--n-gpu-layers": "-ngl"},
}


def _extra_args(context: typer.Context, tool: str) -> list[str]:
    """The arguments after -- for `tool`, refusing the flags tqgguf sets itself."""
    extra = list(context.args)
    if extra and "--" not in sys.argv[1:]:
        raise TqError(f"unexpected argument {extra[0]!r}", f"pass {tool} arguments after --")
    owned = _OWNED.get(tool, {})
    for a in extra:
        flag = a.split("=", 1)[0]
        if flag in owned:
            ours = owned[flag]
            raise TqError(f"{flag} after -- would override what tqgguf {context.command.name} "
                          f"passes to {tool} itself",
                          f"use tqgguf's {ours} instead" if ours else "tqgguf sets it; leave it out")
    return extra


def _chunk_progress():
    from rich.progress import TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description:<20}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("chunks"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=err, transient=True)


def _fail_printer(progress, tasks: dict, with_label: bool = False):
    """Events.fail for the sweeps: drop the config's progress bar and print the failure in one line."""
    from rich.markup import escape

    def fail(label: str, message: str) -> None:
        if label in tasks:
            progress.remove_task(tasks.pop(label))
        text = f"{label}: {message}" if with_label else message
        err.print(f"[bold red]failed:[/] {escape(text)}", highlight=False, soft_wrap=True)
    return fail


def _print_failed(res) -> None:
    """A sweep's last line when configs failed: which, where their logs are, and that a rerun retries them."""
    from rich.markup import escape

    if res.failed:
        err.print(f"[bold red]error:[/] {len(res.failed)} config(s) failed: {escape(', '.join(res.failed))} "
                  f"(logs in {escape(str(res.spec.out / 'logs'))}); a rerun retries them", highlight=False)


def _skip_label(label: str) -> None:
    from rich.markup import escape

    err.print(escape(f"{label:<18} already measured, skipped"), style="dim", highlight=False)


def _print_report(paths: dict, as_json: bool, markdown) -> None:
    """A sweep's result on stdout (its JSON file with --json, else `markdown()`), then where the files went."""
    if as_json:
        print(json.dumps(json.loads(paths["json"].read_text()), indent=1))
    else:
        print(markdown(), end="")
    _log(f"wrote {', '.join(str(p) for p in paths.values())}")


def _without_title(md: str) -> str:
    return md[md.index("\n\n") + 2:]


@app.command(context_settings={"allow_extra_args": True})
@_cli
def ppl(
    context: typer.Context,
    model: Annotated[Path, typer.Option("-m", "--model", help="The GGUF model.")],
    text: Annotated[Path, typer.Option("-f", "--file", help="The evaluation text (e.g. wikitext-2-raw/wiki.test.raw).")],
    configs: Annotated[str, typer.Option("--configs", help="Comma-separated K/V configs: TYPE, K/V, and +bvN for the boundary-layer V policy. f16 is always run (it is the base).")] = PPL_CONFIGS,
    ctx: Annotated[int, typer.Option("-c", "--ctx-size", help="Context per chunk (llama-perplexity's -c).")] = 512,
    chunks: Annotated[int, typer.Option("--chunks", help="Chunks of the text to evaluate (the f16 logits take about chunks x ctx/2 x n_vocab x 2 bytes of disk).")] = 40,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder for ppl.jsonl (the resumable store), ppl.md/.csv/.json/.png and logs/.")] = Path("tqgguf-ppl"),
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="Threads (llama-perplexity's -t).")] = None,
    n_gpu_layers: Annotated[Optional[str], typer.Option("-ngl", "--n-gpu-layers", help="Layers on the GPU (llama-perplexity's -ngl).")] = None,
    floor: Annotated[bool, typer.Option("--floor/--no-floor", help="Also run f16 against the f16 base: the smallest KLD the comparison can show.")] = True,
    plot: PlotOpt = False,
    bin_dir: BinDirOpt = None,
    backend: BackendOpt = ["cpu"],
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds allowed per config.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Perplexity and KL divergence of K/V cache configs against an f16 cache, with error bars; resumable.

    The f16 run saves the logits once (kept in the tqgguf cache and reused while model, text, -c, --chunks and
    build match); every other config reports mean KLD, 99th-percentile KLD, same-top-token %, PPL and the PPL ratio
    against it. Results are appended to OUT/ppl.jsonl as each config finishes: a rerun skips what is done, a killed
    run loses at most the config in flight. Prints a Markdown table sorted by bits per value; a KLD difference
    within 2 standard errors of the row above is shown as "≈". Arguments after `--` go to llama-perplexity.

    Exit codes: 0 all configs measured, 1 a config (or the f16 base) failed, 2 bad input.

    Examples:

        tqgguf ppl -m model.gguf -f wiki.test.raw

        tqgguf ppl -m model.gguf -f wiki.test.raw --configs q8_0,q8_0/turbo4,turbo4/turbo2+bv2 --chunks 20 --plot

        tqgguf ppl -m model.gguf -f wiki.test.raw -ngl 99 --json -- -b 512
    """
    from rich.markup import escape

    from .ppl_sweep import Events, PplSpec, markdown_table, parse_configs, run_sweep, write_report
    from .runinfo import find_tool

    extra = _extra_args(context, "llama-perplexity")
    cfgs = parse_configs(configs)
    if plot:
        from .plot import pyplot

        pyplot()  # fail before measuring when matplotlib is missing
    if threads is not None and threads < 1:
        raise TqError(f"-t must be >= 1, got {threads}")
    binary = find_tool("llama-perplexity", bin_dir, backend)
    spec = PplSpec(model=model.expanduser(), text=text.expanduser(), configs=cfgs, binary=binary,
                   out=out_dir.expanduser(), ctx=ctx, chunks=chunks, threads=threads, n_gpu_layers=n_gpu_layers,
                   floor=floor, extra=extra, timeout=timeout)
    from .ppl_sweep import check_spec

    check_spec(spec)

    def row_line(r) -> str:
        kld = f"KLD {r.kld:.5f} ± {r.kld_err:.5f}" if r.role != "base" and r.kld is not None else "base"
        return (f"{r.config:<18} PPL {r.ppl:.4f} ± {r.ppl_err:.4f}  {kld}  KV {r.kv_mib} MiB"
                + (f"  ({r.seconds:.0f} s)" if r.seconds is not None else ""))

    with _chunk_progress() as progress:
        tasks: dict[str, int] = {}

        def start(label: str, i: int, n: int) -> None:
            tasks[label] = progress.add_task(label, total=chunks)

        def chunk(label: str, done: int, total: int | None) -> None:
            progress.update(tasks[label], completed=done, total=total)

        def done(r) -> None:
            progress.remove_task(tasks.pop(r.config))
            err.print(escape(row_line(r)), highlight=False, soft_wrap=True)

        def skip(r, why: str) -> None:
            what = f"PPL {r.ppl:.4f}" if r.role == "base" else f"KLD {r.kld:.5f}"
            err.print(escape(f"{r.config:<18} already measured ({what}), skipped"), style="dim", highlight=False,
                      soft_wrap=True)

        sweep = run_sweep(spec, Events(start=start, chunk=chunk, done=done, skip=skip,
                                       fail=_fail_printer(progress, tasks), info=_log))
    from .ppl_sweep import NOTES

    _print_report(write_report(sweep, plot), as_json, lambda: markdown_table(sweep.rows) + "\n\n" + NOTES)
    _print_failed(sweep)
    raise typer.Exit(sweep.exit_code)


@app.command(context_settings={"allow_extra_args": True})
@_cli
def bench(
    context: typer.Context,
    model: Annotated[Path, typer.Option("-m", "--model", help="The GGUF model (a `tqgguf synth` model measures speed as well as a real one).")],
    configs: Annotated[str, typer.Option("--configs", help="Comma-separated K/V configs (TYPE, K/V, +bvN); f16 is always measured, as the reference.")] = BENCH_CONFIGS,
    depth: Annotated[str, typer.Option("--depth", "-d", help="Comma-separated depths: tokens already in the cache (llama-bench's -d).")] = "0,4096,32768",
    n_prompt: Annotated[int, typer.Option("-p", "--n-prompt", help="Prompt tokens (llama-bench's -p; batched: -npp).")] = 512,
    n_gen: Annotated[int, typer.Option("-n", "--n-gen", help="Generated tokens (llama-bench's -n; batched: -ntg).")] = 128,
    reps: Annotated[int, typer.Option("-r", "--repetitions", help="Repetitions per test (llama-bench's -r).")] = 3,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="Threads.")] = None,
    n_gpu_layers: Annotated[Optional[str], typer.Option("-ngl", "--n-gpu-layers", help="Layers on the GPU.")] = None,
    batched: Annotated[bool, typer.Option("--batched", help="Run llama-batched-bench: aggregate tok/s of N parallel sequences.")] = False,
    npl: Annotated[str, typer.Option("--npl", help="--batched: comma-separated numbers of parallel sequences.")] = "1,2,4,8",
    ctx: Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="--batched: context per sequence (default: -p + -n).")] = None,
    mem: Annotated[Optional[str], typer.Option("--mem", help="--batched: a memory budget (e.g. 24GiB): run each config at the most sequences that fit, as `tqgguf check --fit slots` sizes them.")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="--batched: use the free memory of the first NVIDIA GPU as the budget.")] = False,
    max_npl: Annotated[int, typer.Option("--max-npl", help="--batched with a budget: never run more sequences than this.")] = 256,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder for bench.jsonl (or batched.jsonl), .md/.csv/.json/.png and logs/.")] = Path("tqgguf-bench"),
    plot: PlotOpt = False,
    bin_dir: BinDirOpt = None,
    backend: BackendOpt = ["cpu"],
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds allowed per config.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Speed of K/V cache configs: tok/s with spread, and each row's ratio to f16 from the same invocation.

    Runs the patched llama-bench -fa 1 per config at each depth (prefill -p and decode -n tokens after --depth
    tokens already in the cache). With --batched, llama-batched-bench measures the aggregate throughput of N
    parallel sequences; with --mem (or --gpu) each config runs at the most sequences that fit the budget, which
    shows what a smaller cache buys at a fixed memory size. Resumable like `tqgguf ppl`; f16 is measured again in
    every invocation that measures anything. Arguments after `--` go to the tool.

    Exit codes: 0 all configs measured, 1 a config failed, 2 bad input.

    Examples:

        tqgguf synth -o /tmp/l3.gguf --preset llama3-8b --weights q4_0 && tqgguf bench -m /tmp/l3.gguf -ngl 99

        tqgguf bench -m model.gguf --configs q8_0,turbo3 --depth 0,4096 -p 512 -n 64 -r 3 --plot

        tqgguf bench -m model.gguf --batched -c 4096 -p 512 -n 128 --mem 24GiB
    """
    from rich.markup import escape

    from .bench_sweep import BenchSpec, Events, parse_list, report_markdown, run_bench_sweep, write_report
    from .ppl_sweep import parse_configs
    from .runinfo import find_tool

    tool = "llama-batched-bench" if batched else "llama-bench"
    extra = _extra_args(context, tool)
    cfgs = parse_configs(configs)
    depths = parse_list(depth, "--depth", 0)
    npls = parse_list(npl, "--npl", 1)
    budget, source = _size_opt(mem, "--mem"), "--mem"
    if gpu:
        from .gpu import gpu_free

        budget, source = gpu_free()
    if (budget is not None or ctx is not None) and not batched:
        raise TqError("-c, --mem and --gpu go with --batched")
    if plot:
        from .plot import pyplot

        pyplot()
    for name, v in (("-t", threads), ("-c", ctx)):
        if v is not None and v < 1:
            raise TqError(f"{name} must be >= 1, got {v}")
    binary = find_tool(tool, bin_dir, backend)
    spec = BenchSpec(model=model.expanduser(), configs=cfgs, binary=binary, out=out_dir.expanduser(), depths=depths,
                     n_prompt=n_prompt, n_gen=n_gen, reps=reps, threads=threads, n_gpu_layers=n_gpu_layers,
                     extra=extra, timeout=timeout, batched=batched, npl=npls, ctx=ctx, mem=budget,
                     mem_source=source if budget else "", max_npl=max_npl)
    from .bench_sweep import check_spec

    check_spec(spec)
    with Progress(TextColumn("[bold]{task.description:<20}"), BarColumn(), MofNCompleteColumn(), TextColumn("tests"),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        tasks: dict[str, int] = {}

        def start(label: str, i: int, n: int, tests: int) -> None:
            tasks[label] = progress.add_task(label, total=tests)

        def test(label: str, done: int) -> None:
            progress.update(tasks[label], completed=done)

        def done(label: str, rows) -> None:
            progress.remove_task(tasks.pop(label))
            err.print(escape(f"{label:<18} " + "  ".join(f"{r.test}@{r.depth}: {r.avg_ts:.1f}" for r in rows
                                                         if not r.test.endswith((" pp", " tg")))),
                      highlight=False, soft_wrap=True)

        res = run_bench_sweep(spec, Events(start=start, test=test, done=done, skip=_skip_label,
                                           fail=_fail_printer(progress, tasks), info=_log))
    _print_report(write_report(res, plot), as_json, lambda: _without_title(report_markdown(res)))
    _print_failed(res)
    raise typer.Exit(res.exit_code)


@app.command(context_settings={"allow_extra_args": True})
@_cli
def niah(
    context: typer.Context,
    model: Annotated[Path, typer.Option("-m", "--model", help="The GGUF model (an instruction-tuned one answers the question).")],
    configs: Annotated[str, typer.Option("--configs", help="Comma-separated K/V configs (TYPE, K/V, +bvN); f16 always runs, as the reference.")] = NIAH_CONFIGS,
    ctx: Annotated[str, typer.Option("--ctx", "-c", help="Comma-separated prompt lengths in tokens.")] = "4096,8192",
    depths: Annotated[str, typer.Option("--depths", help="Comma-separated needle depths, percent of the text.")] = "0,25,50,75,100",
    trials: Annotated[int, typer.Option("--trials", help="Needles per (context, depth) cell, each a different passphrase.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Chooses the passphrases (the same for every config).")] = 0,
    text: Annotated[Optional[Path], typer.Option("-f", "--file", help="Filler text (default: WikiText-2 from ../shared/data, else a generated English text).")] = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="Tokens the answer may have.")] = 24,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="llama-server threads.")] = None,
    n_gpu_layers: Annotated[Optional[str], typer.Option("-ngl", "--n-gpu-layers", help="Layers on the GPU.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder for niah.jsonl (resumable), .md/.csv/.json/.png and server logs.")] = Path("tqgguf-niah"),
    plot: PlotOpt = False,
    bin_dir: BinDirOpt = None,
    backend: BackendOpt = ["cpu"],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the model to load, and for each answer.")] = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Long-context retrieval per K/V config: a needle sentence in a long filler text, asked for at temperature 0.

    For each config the patched llama-server is started as `tqgguf serve` starts it (checked before launch,
    verified after); each (context, depth) cell plants "The secret passphrase is WORD-NNNN." at the depth of a
    filler text cut to the context length in the model's tokens, asks for it, and scores the answer by substring.
    The table gives found/asked per cell and per config with a 95% interval, next to f16 from the same run.
    Resumable (answers go to OUT/niah.jsonl). Arguments after `--` go to llama-server.

    Exit codes: 0 every config answered, 1 a config failed (server or request), 2 bad input.

    Examples:

        tqgguf niah -m model.gguf --configs q8_0/turbo4,turbo4/turbo2+bv2 --ctx 4096,8192

        tqgguf niah -m model.gguf -c 16384,32768 --depths 0,50,100 --trials 3 -ngl 99 --plot
    """
    from rich.markup import escape

    from .bench_sweep import parse_list
    from .niah import Events, NiahSpec, report_markdown, run_niah, write_report
    from .ppl_sweep import parse_configs
    from .textdata import eval_text

    extra = _extra_args(context, "llama-server")
    cfgs = parse_configs(configs)
    ctxs = parse_list(ctx, "--ctx", 256)
    dlist = parse_list(depths, "--depths", 0)
    if trials < 1 or n_predict < 1:
        raise TqError("--trials and -n must be >= 1")
    if plot:
        from .plot import pyplot

        pyplot()
    if bin_dir is not None:
        _use_bin_dir(bin_dir)
    if text is None:
        from .paths import cache_dir

        text = eval_text(cache_dir())
    spec = NiahSpec(model=model.expanduser(), configs=cfgs, filler=text.expanduser(), out=out_dir.expanduser(),
                    ctxs=ctxs, depths=dlist, trials=trials, seed=seed, n_predict=n_predict, threads=threads,
                    n_gpu_layers=n_gpu_layers, backends=backend, extra=extra, startup_timeout=timeout,
                    request_timeout=timeout)
    from .niah import check_spec

    check_spec(spec)
    n_cells = len(ctxs) * len(dlist) * trials
    with Progress(TextColumn("[bold]{task.description:<20}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("needles"), TimeElapsedColumn(), console=err, transient=True) as progress:
        tasks: dict[str, int] = {}

        def start(label: str, todo: int) -> None:
            tasks[label] = progress.add_task(label, total=n_cells, completed=n_cells - todo)

        def server(label: str, eff: dict) -> None:
            err.print(escape(f"{label:<18} server up: K {eff.get('k')}, V {eff.get('v_types') or eff.get('v')}, "
                             f"KV {eff.get('kv_mib')} MiB"), highlight=False, soft_wrap=True)

        def answer(label: str, r: dict) -> None:
            progress.advance(tasks[label])
            err.print(escape(f"{label:<18} ctx {r['ctx']} depth {r['depth']}%: {'found' if r['hit'] else 'MISSED'} "
                             f"({r['passphrase']}; answer {r['answer'][:60]!r}, {r['seconds']:.0f} s)"),
                      highlight=False, soft_wrap=True)

        res = run_niah(spec, Events(start=start, server=server, answer=answer, skip=_skip_label,
                                    fail=_fail_printer(progress, tasks, with_label=True), info=_log))
    _print_report(write_report(res, plot), as_json, lambda: _without_title(report_markdown(res)))
    _print_failed(res)
    raise typer.Exit(res.exit_code)


def run() -> None:  # pragma: no cover
    sys.exit(app())
