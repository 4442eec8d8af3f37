"""Named suites of reference releases: what `manage.py suite run` adapts on a pool.

A suite is a JSON file next to this module (`<name>.json`): a title, a description and its
entries, each one release kept in the checkout as a mirror folder (`<root>/<org>/<name>/`, a
path relative to the checkout) with the family shapes it stands for and what it exercises.
`suite_load(name)` reads and checks one; the app finds each entry's release through the
mirror hub kind, as a mirror watch on the entry's root would.

Plain Python: no Django. The app passes its checkout (`settings.BASE_DIR`) as `base_dir`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SUITES_DIR = Path(__file__).resolve().parent
# The checkout: entries' folders are relative to it.
CHECKOUT_DIR = SUITES_DIR.parent.parent

# The family shapes a suite entry may stand for, and those the standard suite must cover
# (one reference release at least per shape).
SHAPES = (
    "dense-gqa",
    "moe",
    "mla-moe",
    "sliding-window-sinks",
    "hybrid-linear-attention",
    "quantized",
)
STANDARD_SUITE = "standard"

_SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class SuiteError(ValueError):
    """A suite file is missing or malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class SuiteEntry:
    """One reference release of a suite.

    `name` is a slug (at most 64 characters, `AdaptationJob.suite_entry`); `folder` the
    release's mirror folder relative to the checkout, `<root>/<org>/<name>`; `shapes` the
    family shapes it stands for (`SHAPES`), the first its row's label.
    """

    name: str
    shapes: tuple[str, ...]
    folder: str
    exercises: str

    @property
    def root(self) -> str:
        """The mirror root the release lies in, relative to the checkout."""
        return str(PurePosixPath(self.folder).parent.parent)

    @property
    def repo_id(self) -> str:
        """ "org/name", as the mirror hub kind lists the folder."""
        path = PurePosixPath(self.folder)
        return f"{path.parent.name}/{path.name}"


@dataclass(frozen=True)
class Suite:
    """A named suite: its entries in the file's order (the matrix's rows)."""

    name: str
    title: str
    description: str
    entries: tuple[SuiteEntry, ...]

    def entry(self, name: str) -> SuiteEntry | None:
        return next((e for e in self.entries if e.name == name), None)


def suite_names() -> list[str]:
    """The suites this checkout defines (the JSON files next to this module), sorted."""
    return sorted(path.stem for path in SUITES_DIR.glob("*.json"))


def suite_load(name: str, *, base_dir: Path = CHECKOUT_DIR) -> Suite:
    """The suite `name`, checked: a slug name matching its file, at least one entry, entry
    names unique slugs, known shapes, each folder a relative `<root>/<org>/<name>` path
    without `..` holding a `config.json` under `base_dir`; the standard suite must cover
    every shape in `SHAPES`. Raises `SuiteError` naming what is wrong."""
    if not _SLUG_RE.match(name):
        raise SuiteError(f"{name!r} is not a suite name (lowercase letters, digits and dashes).")
    path = SUITES_DIR / f"{name}.json"
    if not path.is_file():
        known = ", ".join(suite_names()) or "none"
        raise SuiteError(f"No suite {name!r}; the suites are: {known}.")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SuiteError(f"{path.name} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("name") != name:
        raise SuiteError(f"{path.name} must be an object whose name is {name!r}.")
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise SuiteError(f"{path.name} has no entries.")
    entries = tuple(_entry(raw, path.name, base_dir) for raw in raw_entries)
    names = [e.name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SuiteError(f"{path.name}: entry names used twice: {', '.join(duplicates)}.")
    folders = [e.folder for e in entries]
    if len(set(folders)) != len(folders):
        raise SuiteError(f"{path.name}: two entries name the same folder.")
    if name == STANDARD_SUITE:
        covered = {shape for e in entries for shape in e.shapes}
        missing = [s for s in SHAPES if s not in covered]
        if missing:
            raise SuiteError(f"{path.name} has no entry for {', '.join(missing)}.")
    return Suite(
        name=name,
        title=str(data.get("title") or name),
        description=str(data.get("description") or ""),
        entries=entries,
    )


def _entry(raw: object, file: str, base_dir: Path) -> SuiteEntry:
    if not isinstance(raw, dict):
        raise SuiteError(f"{file}: each entry must be an object.")
    name = raw.get("name")
    if not isinstance(name, str) or not _SLUG_RE.match(name):
        raise SuiteError(f"{file}: entry name {name!r} is not a slug of at most 64 characters.")
    shapes = raw.get("shapes")
    if not isinstance(shapes, list) or not shapes:
        raise SuiteError(f"{file}: entry {name} names no shapes.")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SuiteError(
            f"{file}: entry {name} has unknown shapes {unknown}; known: {', '.join(SHAPES)}."
        )
    folder = raw.get("folder")
    parts = PurePosixPath(folder).parts if isinstance(folder, str) else ()
    if len(parts) < 3 or PurePosixPath(folder).is_absolute() or ".." in parts:
        raise SuiteError(
            f"{file}: entry {name}'s folder {folder!r} must be a path relative to the checkout, "
            "<root>/<org>/<name>, without '..'."
        )
    if not (base_dir / folder / "config.json").is_file():
        raise SuiteError(f"{file}: entry {name}'s folder {folder} has no config.json.")
    return SuiteEntry(
        name=name,
        shapes=tuple(shapes),
        folder=str(folder),
        exercises=str(raw.get("exercises") or ""),
    )
