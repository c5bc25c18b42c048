"""Named federation files that ship with fedhet (``fedhet presets`` lists them)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml"))


def path(name: str) -> Path:
    p = resources.files(__name__) / f"{name}.toml"
    if not p.is_file():
        raise FileNotFoundError(f"no preset named {name!r}; presets: {', '.join(names())}")
    return Path(str(p))


def describe(name: str) -> str:
    """The first comment lines of a preset."""
    lines = []
    for line in path(name).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)
