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

out = Console()
err = Console(stderr=True)


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
    err.print(f"[dim]{msg}[/]", highlight=False)


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
    cuda_arch: Annotated[Optional[str], typer.Option("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES, e.g. 90 (default: native).")] = None,
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

        tqgguf build -b cuda --cuda-arch 90 -j16

        $(tqgguf build --print-bin llama-server) --help
    """
    from .build import DEFAULT_TARGETS, BuildSpec, find_bin, run_build
    from .source import cached_pinned_source, resolve_source

    pin = _pin()
    tlist = [t.strip() for t in targets.split(",") if t.strip()] if targets else list(DEFAULT_TARGETS)
    spec = BuildSpec(backends=backend, build_type=build_type, cuda_arch=cuda_arch, hip_arch=hip_arch,
                     native=native, targets=tlist)
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
    out_path: Annotated[Path, typer.Option("-o", "--out", help="Output GGUF file.")],
    preset: Annotated[Optional[str], typer.Option("--preset", help="A named shape (see --list-presets).")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers")] = None,
    n_embd: Annotated[Optional[int], typer.Option("--n-embd")] = None,
    n_head: Annotated[Optional[int], typer.Option("--n-head")] = None,
    n_head_kv: Annotated[Optional[int], typer.Option("--n-head-kv")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim")] = None,
    n_ff: Annotated[Optional[int], typer.Option("--n-ff")] = None,
    sliding_window: Annotated[Optional[int], typer.Option("--sliding-window", help="Sliding-window size (gemma3 architecture).")] = None,
    swa_pattern: Annotated[Optional[int], typer.Option("--swa-pattern", help="Every P-th layer is full attention.")] = None,
    weights: Annotated[str, typer.Option("--weights", help="q4_0, q8_0 or f16.")] = "q8_0",
    vocab: Annotated[str, typer.Option("--vocab", help="Tokenizer: models/ggml-vocab-NAME.gguf of the pinned tree.")] = "llama-bpe",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    list_presets: Annotated[bool, typer.Option("--list-presets", help="List the presets and exit.")] = False,
    source: SourceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a random-weight GGUF with a real tokenizer, for shapes no small real model has.

    Examples:

        tqgguf synth -o /tmp/l3-8b.gguf --preset llama3-8b --weights q4_0

        tqgguf synth -o /tmp/gqa8.gguf --layers 4 --n-embd 1024 --n-head 16 --n-head-kv 2 --head-dim 128

        tqgguf synth -o /tmp/swa.gguf --preset tiny-swa
    """
    import dataclasses

    from .source import resolve_source
    from .synth import PRESETS, SynthShape, find_vocab
    from .synth import synth as write_model

    if list_presets:
        for name, sh in PRESETS.items():
            out.print(f"{name:<11} {sh}", highlight=False)
        return
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
            info = write_model(out_path, shape, vocab_path, weights=weights, seed=seed,
                               progress=lambda i, n, name: progress.update(task, completed=i, total=n, description=name))
    except ValueError as e:
        raise TqError(str(e)) from None
    if as_json:
        d = dataclasses.asdict(info)
        print(json.dumps(d, indent=1, default=str))
        return
    out.print(f"wrote {info.path} ({info.arch}, {info.n_params / 1e6:.1f} M params, "
              f"{info.file_size / 2**20:.1f} MiB, {info.weights} weights, vocab {info.vocab.name})", highlight=False)


def run() -> None:  # pragma: no cover
    sys.exit(app())
