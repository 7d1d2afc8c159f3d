"""Building the compiled modules of `brokerlet._compiled` with mypyc.

``python -m brokerlet._compile`` builds them unless the build is current (``make compiled``
runs it with ``--or-source``); ``--check`` only says whether it is, and fails if not. Needs
mypy (which carries mypyc), setuptools and a C compiler: build-time tools, never imported by a
broker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import mypy.version

from brokerlet._compiled import (
    BUILD_DIRECTORY,
    GROUP,
    MANIFEST,
    MODULES,
    PURE_PYTHON_VARIABLE,
    SOURCE_ROOT,
    digest,
    extension_suffix,
    plan,
    source_of,
)

__all__ = ["build", "main"]


def build(directory: Path = BUILD_DIRECTORY) -> None:
    """Compile `MODULES` with mypyc into ``directory`` (replacing any build there) and record
    their sources' digests. Needs mypy (which carries mypyc), setuptools and a C compiler."""
    digests = {module: digest(source_of(module)) for module in MODULES}
    with tempfile.TemporaryDirectory(prefix="brokerlet-mypyc-") as scratch:
        output = Path(scratch) / "lib"
        # A child process: setuptools and mypyc keep global state, and their output is
        # printed only if the build fails.
        script = (
            "import sys\n"
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            "paths, group, c_dir, out, temp = sys.argv[1:6]\n"
            "setup(name=group, ext_modules=mypycify(paths.split(','), group_name=group,\n"
            "      target_dir=c_dir), script_args=['build_ext', '--build-lib', out,\n"
            "      '--build-temp', temp])\n"
        )
        paths = ",".join(str(source_of(module).relative_to(SOURCE_ROOT)) for module in MODULES)
        command = [
            sys.executable,
            "-c",
            script,
            paths,
            GROUP,
            str(Path(scratch) / "c"),
            str(output),
            str(Path(scratch) / "temp"),
        ]
        environment = {**os.environ, PURE_PYTHON_VARIABLE: "1"}
        result = subprocess.run(
            command, check=False, cwd=SOURCE_ROOT, capture_output=True, text=True, env=environment
        )
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            raise SystemExit(f"mypyc failed to compile {paths} (exit {result.returncode})")
        suffix = extension_suffix()
        modules = {
            module: {
                "sha256": digests[module],
                "file": str(Path(*module.split(".")).with_suffix("")) + suffix,
            }
            for module in MODULES
        }
        support = {f"{GROUP}__mypyc": f"{GROUP}__mypyc{suffix}"}
        for file in [*(entry["file"] for entry in modules.values()), *support.values()]:
            if not (output / file).is_file():
                raise SystemExit(f"mypyc's build has no {file}")
        manifest = {
            "extension_suffix": suffix,
            "mypy": mypy.version.__version__,
            "modules": modules,
            "support": support,
        }
        (output / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        # Replaced whole, so a build is never half old and half new.
        if directory.exists():
            shutil.rmtree(directory)
        shutil.copytree(output, directory)


def main(arguments: Sequence[str] = ()) -> None:
    """``python -m brokerlet._compile [--check | --or-source]``: build unless the build is
    current; ``--check`` only says whether it is, and fails if not; ``--or-source`` says why
    a build failed and exits 0, since brokerlet then runs from source."""
    files, status = plan(BUILD_DIRECTORY)
    if "--check" in arguments:
        print(f"brokerlet modules: {status}")
        if not files:
            raise SystemExit(1)
        return
    if files:
        return
    print(f"compiling {len(MODULES)} modules with mypyc into {BUILD_DIRECTORY} ({status})")
    try:
        build()
    except SystemExit as failure:
        if "--or-source" not in arguments:
            raise
        print(f"{failure}; brokerlet runs from source", file=sys.stderr)
        return
    print(f"brokerlet modules: {plan(BUILD_DIRECTORY)[1]}")


if __name__ == "__main__":
    main(sys.argv[1:])
