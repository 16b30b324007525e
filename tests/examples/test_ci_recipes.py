"""The CI recipes in `examples/ci` are meant to be copied as they are: they parse, they run the script with
the manifests folder, they take the passphrase from a secret, they never hand secrets to a fork's code, and
the Pulumi CLI they install is the version proxy-operator pins. (No runner runs them here; the script they
call is tested in test_ci_preview.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"
PINNED = re.search(r'"pulumi==([0-9.]+)"', (CI.parents[1] / "pyproject.toml").read_text())
RUN = 'python ci/preview-pr.py --manifests "$MANIFESTS"'


def load(name: str) -> dict[Any, Any]:
    document = yaml.safe_load((CI / name).read_text())
    assert isinstance(document, dict)
    return document


def test_the_github_workflow() -> None:
    workflow = load("github-actions.yml")
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert set(triggers) == {"pull_request"}, "pull_request_target would run a fork's code with the secrets"
    assert workflow["permissions"]["pull-requests"] == "write"
    assert PINNED is not None
    assert workflow["env"]["PULUMI_VERSION"] == PINNED.group(1)
    assert workflow["env"]["PULUMI_BACKEND_URL"].startswith(("s3://", "gs://"))
    job = workflow["jobs"]["preview"]
    assert "head.repo.full_name == github.repository" in job["if"]
    [step] = [s for s in job["steps"] if RUN in s.get("run", "")]
    assert step["env"]["PULUMI_CONFIG_PASSPHRASE"].startswith("${{ secrets.")
    assert "GITHUB_TOKEN" in step["env"]


def test_the_gitlab_job() -> None:
    job = load("gitlab-ci.yml")["proxy-preview"]
    assert job["rules"][0]["if"] == '$CI_PIPELINE_SOURCE == "merge_request_event"'
    assert PINNED is not None
    assert job["variables"]["PULUMI_VERSION"] == PINNED.group(1)
    assert job["variables"]["PULUMI_BACKEND_URL"].startswith(("s3://", "gs://"))
    assert "PULUMI_CONFIG_PASSPHRASE" not in job["variables"], "a secret belongs in a masked CI/CD variable"
    assert any(RUN in line for line in job["script"])
