"""A small fixed-seed fault campaign, part of the normal suite: two `serve` replicas as processes, the real
engine and apiserver, one sequence of three faults from the most important kinds; zero violations wanted.

On today's code it is expected to fail, listing the violations (see tests/faults/README.md); reproduce with
`python -m tests.faults.campaign --seed 14 --sequences 1 --faults-per-sequence 3 --replicas 2 --bound 75
--fault kill-leader-during-up --fault sigstop-leader --fault skip-cleanup-during-deletion
--fault mass-deletion`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TOOLS_BIN
from tests.faults.campaign import run

pytestmark = pytest.mark.engine

SEED = 14
KINDS = ["kill-leader-during-up", "sigstop-leader", "skip-cleanup-during-deletion", "mass-deletion"]


def test_a_small_fixed_seed_campaign_finds_no_violation(tmp_path: Path) -> None:
    if not (TOOLS_BIN / "pulumi").exists():
        pytest.fail(f"{TOOLS_BIN / 'pulumi'} is missing: run `make tools` first")
    summary = run(
        tmp_path, seed=SEED, sequences=1, faults_per_sequence=3, replicas=2, kinds=KINDS, bound=75.0
    )
    print(summary.text())
    assert summary.violations == [], summary.text()
