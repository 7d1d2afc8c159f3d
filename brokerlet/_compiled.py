"""The hot modules compiled with mypyc, loaded in place of their source when built.

``make compiled`` (``python -m brokerlet._compile``) compiles `MODULES` into ``.compiled/``
at the top of a source checkout and records each source's SHA-256 with the build. Importing
brokerlet loads the compiled modules only when every recorded source is unchanged and the
build is for this interpreter; otherwise every module runs from source. An edit that was not
rebuilt therefore runs as written, never as the old build. ``BROKERLET_PURE_PYTHON=1`` runs
everything from source (the line tracer, the tests' second run). A wheel (``setup.py``)
carries its own build in ``brokerlet/_mypyc/``, checked the same way against the sources
installed beside it; a wheel built without a C compiler has none and runs from source.

The compiled modules are the per-message ones (about a sixth of the saturated paths'
instructions; docs/performance.md, twelfth and twenty-first passes). Compiled code checks
argument types at its boundaries and calls functions of its own build directly, so patching
one of their module attributes changes only what Python callers see.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = [
    "BUILD_DIRECTORY",
    "MODULES",
    "PACKAGED_BUILD",
    "PURE_PYTHON_VARIABLE",
    "STATUS",
    "compiled_modules",
    "in_use",
    "plan",
]

MODULES = (
    "brokerlet.transport.protocol._fast",
    "brokerlet.transport.protocol._payload",
    "brokerlet.transport.protocol._framing",
    "brokerlet.transport.protocol._scan",
    "brokerlet.dispatch.consumer",
    "brokerlet.dispatch.delivery",
    "brokerlet.dispatch.delayed",
    "brokerlet.dispatch.key_shared",
    "brokerlet.keyshared.hashing",
    "brokerlet.keyshared.selectors",
    "brokerlet.producers.appends",
    "brokerlet.storage.cursor",
    "brokerlet.transport.channel",
    "brokerlet.actors._loop",
    "brokerlet.storage._worker",
    "brokerlet.storage._segments",
    "brokerlet.storage._records",
    "brokerlet.storage._reading",
    "brokerlet.storage.disk",
    "brokerlet.storage.ledger",
    "brokerlet.dispatch.strategy",
    "brokerlet.dispatch.shared",
    "brokerlet.dispatch.single_active",
    "brokerlet.dispatch.filters",
    "brokerlet.dispatch.read_backoff",
    "brokerlet.dispatch.batch_acks",
)

PURE_PYTHON_VARIABLE = "BROKERLET_PURE_PYTHON"
GROUP = "brokerlet_compiled"  # mypyc's shared library is `{GROUP}__mypyc`
SOURCE_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIRECTORY = SOURCE_ROOT / ".compiled"
PACKAGED_BUILD = Path(__file__).resolve().parent / "_mypyc"
"""Where an installed wheel's build is (a checkout has none: ``.compiled`` is its build)."""
MANIFEST = "manifest.json"


def source_of(module: str, root: Path = SOURCE_ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def plan(directory: Path, root: Path = SOURCE_ROOT) -> tuple[dict[str, Path], str]:
    """The files to load each compiled module (and mypyc's support library) from, and a
    status line; no files when the build in ``directory`` is missing, is for another
    interpreter, compiles another module list, or any of its sources changed since."""
    manifest_path = directory / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return {}, f"source (no build in {directory}; make compiled builds one)"
    except (OSError, ValueError) as error:
        return {}, f"source (unreadable {manifest_path}: {error})"
    if manifest.get("extension_suffix") != extension_suffix():
        return {}, f"source (the build in {directory} is for another interpreter)"
    recorded = manifest.get("modules", {})
    if sorted(recorded) != sorted(MODULES):
        return {}, f"source (the build in {directory} compiles another module list)"
    files: dict[str, Path] = {}
    for module, entry in recorded.items():
        source = source_of(module, root)
        try:
            changed = digest(source) != entry["sha256"]
        except OSError:
            changed = True
        if changed:
            relative = source.relative_to(root)
            return {}, f"source ({relative} changed since the build; make compiled rebuilds)"
        files[module] = directory / entry["file"]
    for module, file in manifest.get("support", {}).items():
        files[module] = directory / file
    if not all(file.is_file() for file in files.values()):
        return {}, f"source (files of the build in {directory} are missing)"
    return files, f"compiled ({len(MODULES)} modules, mypyc {manifest.get('mypy', '?')})"


class _CompiledFinder:
    """A meta path finder that answers for the compiled modules only."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        file = self.files.get(name)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(name, file)


def _install() -> str:
    if os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0"):
        return f"source ({PURE_PYTHON_VARIABLE} is set)"
    files, status = plan(PACKAGED_BUILD if PACKAGED_BUILD.is_dir() else BUILD_DIRECTORY)
    if files:
        # Before every other finder, and before any of the modules is imported: brokerlet's
        # __init__ imports this module first.
        sys.meta_path.insert(0, _CompiledFinder(files))
    return status


STATUS = _install()
"""How the compiled modules are loaded: ``compiled (...)`` or ``source (why)``."""


def compiled_modules() -> list[str]:
    """Which of `MODULES` are imported now as compiled extension modules."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [
        module
        for module in MODULES
        if (loaded := sys.modules.get(module)) is not None
        and str(getattr(loaded, "__file__", "")).endswith(suffixes)
    ]


def in_use() -> bool:
    """Whether this process loads the compiled modules."""
    return STATUS.startswith("compiled")
