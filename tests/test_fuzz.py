"""The bounded fuzz run of ``make test`` (issue 10); ``make fuzz`` runs it for longer.

A few thousand seeded inputs of every category in tests/fuzz.py against a broker with disk
storage: no actor may fail, every topic used stays usable, the witness loses nothing and no
connection socket is left open.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fuzz import CATEGORIES, run

from brokerlet import Broker

INPUTS_PER_CATEGORY = 2000
SEED = 10


@pytest.mark.timeout(120)
def test_bounded_fuzz_breaks_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="brokerlet")
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as broker:
        report = run(broker, seed=SEED, inputs_per_category=INPUTS_PER_CATEGORY)
    print("\n".join(report.lines()))
    assert all(report.inputs[c] >= INPUTS_PER_CATEGORY for c in CATEGORIES)
    assert report.problems() == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
