"""The compiled hot modules (brokerlet._compiled): loaded only from a build of the sources as
they are now, for this interpreter; otherwise every module runs from source."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brokerlet import _compiled, load_settings
from brokerlet._compiled import MODULES, digest, extension_suffix, plan, source_of

ROOT = Path(__file__).resolve().parent.parent


def _fake_build(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the compiled modules' sources and a build of them (empty files for the
    libraries): what `plan` reads, without a compiler."""
    root = tmp_path / "src"
    build = tmp_path / "build"
    suffix = extension_suffix()
    modules = {}
    for module in MODULES:
        source = source_of(module, root)
        source.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_of(module), source)
        file = "/".join(module.split(".")) + suffix
        (build / file).parent.mkdir(parents=True, exist_ok=True)
        (build / file).write_bytes(b"")
        modules[module] = {"sha256": digest(source), "file": file}
    support = {"brokerlet_compiled__mypyc": f"brokerlet_compiled__mypyc{suffix}"}
    (build / support["brokerlet_compiled__mypyc"]).write_bytes(b"")
    manifest = {"extension_suffix": suffix, "mypy": "x", "modules": modules, "support": support}
    (build / "manifest.json").write_text(json.dumps(manifest))
    return root, build


def test_a_current_build_is_planned_module_by_module(tmp_path: Path) -> None:
    root, build = _fake_build(tmp_path)
    files, status = plan(build, root)
    assert status.startswith(f"compiled ({len(MODULES)} modules")
    assert set(files) == {*MODULES, "brokerlet_compiled__mypyc"}
    assert (
        files["brokerlet.storage.cursor"] == build / f"brokerlet/storage/cursor{extension_suffix()}"
    )


def test_an_edited_source_runs_from_source_not_from_the_old_build(tmp_path: Path) -> None:
    root, build = _fake_build(tmp_path)
    edited = source_of("brokerlet.dispatch.delivery", root)
    edited.write_text(edited.read_text() + "\n# edited\n")
    assert plan(build, root) == (
        {},
        "source (brokerlet/dispatch/delivery.py changed since the build; make compiled rebuilds)",
    )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda manifest: manifest.update(extension_suffix=".cpython-399.so"),
            "another interpreter",
        ),
        (lambda manifest: manifest["modules"].popitem(), "another module list"),
    ],
)
def test_a_build_for_something_else_is_not_loaded(tmp_path: Path, change: object, why: str) -> None:
    root, build = _fake_build(tmp_path)
    manifest = json.loads((build / "manifest.json").read_text())
    change(manifest)  # type: ignore[operator]
    (build / "manifest.json").write_text(json.dumps(manifest))
    files, status = plan(build, root)
    assert files == {}
    assert why in status


def test_a_missing_or_partial_build_is_not_loaded(tmp_path: Path) -> None:
    root, build = _fake_build(tmp_path)
    (build / "brokerlet/storage" / f"cursor{extension_suffix()}").unlink()
    assert plan(build, root) == ({}, f"source (files of the build in {build} are missing)")
    assert plan(tmp_path / "none", root)[0] == {}


def _loaded_in_a_child(environment: dict[str, str]) -> list[str]:
    code = (
        "import brokerlet, brokerlet._compiled as c\n"
        "for m in c.MODULES: __import__(m)\n"
        "print(','.join(c.compiled_modules()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [module for module in result.stdout.strip().split(",") if module]


def test_pure_python_is_what_the_variable_asks_for() -> None:
    environment = {**os.environ, "BROKERLET_PURE_PYTHON": "1"}
    assert _loaded_in_a_child(environment) == []


@pytest.mark.skipif(not _compiled.in_use(), reason=f"hot modules: {_compiled.STATUS}")
def test_a_current_build_replaces_every_hot_module() -> None:
    environment = {
        key: value for key, value in os.environ.items() if key != "BROKERLET_PURE_PYTHON"
    }
    assert _loaded_in_a_child(environment) == list(MODULES)
    for module in MODULES:
        assert sys.modules[module].__file__.endswith(extension_suffix())  # type: ignore[union-attr]


def test_the_variable_is_not_read_as_a_setting() -> None:
    settings = load_settings(env={"BROKERLET_PURE_PYTHON": "1", "BROKERLET_PORT": "6651"})
    assert settings.port == 6651
