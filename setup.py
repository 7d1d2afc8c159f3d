"""Wheels carry the hot modules compiled with mypyc, as ``make compiled`` builds them.

``pip install .`` and ``pip wheel .`` compile `brokerlet._compiled.MODULES` into the wheel's
``brokerlet/_mypyc/`` (with the manifest `brokerlet._compiled` checks at import), so an
installed broker runs what a checkout's ``make run`` runs. The metadata is pyproject.toml's.
Without a C compiler the build says why and the wheel runs from source;
``BROKERLET_PURE_PYTHON=1`` set for the build makes a pure wheel on purpose. Editable
installs compile nothing here: a checkout has ``make compiled``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
PURE = os.environ.get("BROKERLET_PURE_PYTHON", "") not in ("", "0")


class BuildPyCompiled(build_py):
    def run(self) -> None:
        super().run()
        if PURE or self.editable_mode:
            return
        # Imported only now, when the build requirements (_compile_requirements) are.
        sys.path.insert(0, str(ROOT))
        tool = importlib.import_module("brokerlet._compile")
        target = Path(self.build_lib) / "brokerlet" / "_mypyc"
        try:
            tool.build(target)
        except SystemExit as failure:
            shutil.rmtree(target, ignore_errors=True)  # never an older build of other sources
            print(f"brokerlet: {failure}; this wheel runs from source", file=sys.stderr)


class CompiledDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        # The build is for one interpreter and platform, so the wheel's tag must say which.
        return not PURE


def _compile_requirements() -> list[str]:
    # mypyc type-checks the compiled modules with everything they import, so the build
    # environment needs the runtime dependencies too (pyproject.toml's build-system has mypy).
    if PURE:
        return []
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


setup(
    cmdclass={"build_py": BuildPyCompiled},
    distclass=CompiledDistribution,
    # PEP 517's build_meta hands these to the installer as build requirements.
    setup_requires=_compile_requirements(),
)
