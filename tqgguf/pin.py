"""The pin file, patches/source.toml: upstream version, sha256 and the ordered patch list."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TqError
from .paths import patches_dir


@dataclass
class Pin:
    package: str
    version: str
    filename: str
    sha256: str
    subdir: str
    upstream_commit: str
    series: list[str] = field(default_factory=list)
    path: Path | None = None

    @property
    def patch_paths(self) -> list[Path]:
        assert self.path is not None
        return [self.path.parent / name for name in self.series]

    @property
    def pip_spec(self) -> str:
        return f"{self.package}=={self.version}"


def load_pin(path: Path | None = None) -> Pin:
    path = path or patches_dir() / "source.toml"
    try:
        data = tomllib.loads(path.read_text())
        src, up = data["source"], data["upstream"]
        pin = Pin(
            package=src["package"],
            version=src["version"],
            filename=src["filename"],
            sha256=src["sha256"].lower(),
            subdir=src["subdir"],
            upstream_commit=up["commit"],
            series=list(data.get("patches", {}).get("series", [])),
            path=path,
        )
    except FileNotFoundError:
        raise TqError(f"pin file not found: {path}") from None
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise TqError(f"pin file {path} is malformed: {e}") from None
    for name in pin.series:
        if not (path.parent / name).is_file():
            raise TqError(f"{path.name} lists {name}, which is not in {path.parent}")
    return pin


_SERIES_RE = re.compile(r"^series = \[\n(?:.*\n)*?\]\n", re.M)


def write_series(pin_path: Path, series: list[str]) -> None:
    """Rewrite only the `series = [...]` list of the pin file, keeping its comments."""
    text = pin_path.read_text()
    body = "".join(f'    "{name}",\n' for name in series)
    new, n = _SERIES_RE.subn(lambda _: f"series = [\n{body}]\n", text, count=1)
    if n != 1:
        raise TqError(f"cannot find the `series = [` list in {pin_path}")
    pin_path.write_text(new)
