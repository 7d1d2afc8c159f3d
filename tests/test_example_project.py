"""The example project (examples/orders-service) works with nothing but ``pip install``.

A fresh virtual environment gets brokerlet from this checkout plus pytest and Locust, with
pip's usual configuration (the local cache and the package registry; versions held to
requirements.lock). In it, the example's own tests run (brokerlet's plugin, loaded by its
entry point, starts their broker) and then its locustfile runs headless for 10 seconds
against a broker on this process's thread; both must pass, the load test's delivery verdict
included. Sources are copied first, so nothing is built or cached inside the checkout. The
installed broker runs the hot modules compiled into its wheel by setup.py, not from source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brokerlet import Broker
from brokerlet._compiled import MODULES, PURE_PYTHON_VARIABLE

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = REPO_ROOT / "examples" / "orders-service"


def _run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    # Not BROKERLET_PURE_PYTHON either (the suite's second run sets it): it would make the
    # build a pure wheel.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "VIRTUAL_ENV", PURE_PYTHON_VARIABLE))
    }
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_example_installs_tests_and_load_tests_in_a_fresh_venv(tmp_path: Path) -> None:
    source = tmp_path / "brokerlet-src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    shutil.copytree(
        REPO_ROOT / "brokerlet",
        source / "brokerlet",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    project = tmp_path / "orders-service"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 60)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    installed = _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(REPO_ROOT / "requirements.lock"),
            str(source),
            "pytest",
            "locust",
        ],
        tmp_path,
        240,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    status = _run(
        [python, "-c", "import brokerlet._compiled as c; print(c.STATUS, c.PACKAGED_BUILD)"],
        tmp_path,
        30,
    )
    assert status.stdout.startswith(f"compiled ({len(MODULES)} modules"), status
    assert str(venv) in status.stdout, status.stdout  # the wheel's build, not the checkout's

    tests = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, 120)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout, tests.stdout

    with Broker(port=0) as broker:
        load = _run(
            [
                str(venv / "bin" / "locust"),
                "-f",
                "locustfile.py",
                "--headless",
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "10s",
                "--host",
                broker.service_url,
                "--only-summary",
                "--pulsar-drain-seconds",
                "5",
            ],
            project,
            60,
        )
        stats = broker.topic_stats("persistent://public/default/orders")
    log = load.stdout + load.stderr
    assert load.returncode == 0, log
    assert "delivery verdict: PASS" in log, log
    assert stats is not None
    assert stats["msgInCounter"] > 50, stats
    assert stats["subscriptions"]["billing"]["msgBacklog"] == 0
