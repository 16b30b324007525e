"""Preview in CI (`examples/ci`): the script the GitHub Actions workflow and the GitLab job run, run here.

The CI runners themselves cannot run here (no GitHub, no GitLab, no network beyond loopback), so these tests
run what the jobs run after installing proxy-operator: `examples/ci/preview-pr.py`, in a subprocess with
the environment a job has. The shared state backend is moto's S3 in server mode with IAM enforced: the
service applies with a read-write user, the job previews with a user that may only get and list objects
(as the recipe's read-only credentials), and the bucket's objects are listed before and after: identical.
The pull-request comment goes to a small fake of the GitHub (and GitLab) comment API on loopback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import botocore.exceptions
import pytest
import yaml

from tests.automation.fleet import Fleet, accepts, proxy_doc
from tests.conftest import PulumiEnv
from tests.examples.fake_forge import TOKEN, Forge, serve_forge
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ci" / "preview-pr.py"
PROXY_OPERATOR = Path(sys.executable).parent / "proxy-operator"
BUCKET = "proxy-operator-state"
REPO = "acme/crawl-proxies"
PR = 7


def load_script() -> ModuleType:
    """The script as a module (its file name is no module name)."""
    if "preview_pr" not in sys.modules:
        spec = importlib.util.spec_from_file_location("preview_pr", SCRIPT)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["preview_pr"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["preview_pr"]


MARKER = load_script().MARKER


# --- moto with IAM: a read-write user for the service, a read-only one for CI --------------------------


@dataclass(frozen=True)
class Keys:
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


@dataclass(frozen=True)
class StateBucket:
    endpoint: str
    writer: Keys
    reader: Keys

    @property
    def backend_url(self) -> str:
        host = self.endpoint.removeprefix("http://")
        return f"s3://{BUCKET}?endpoint={host}&disableSSL=true&s3ForcePathStyle=true&region=us-east-1"

    def client(self, keys: Keys) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
        )

    def objects(self) -> dict[str, tuple[str, int, str]]:
        """Every object of the bucket: key -> (ETag, size, last modified)."""
        listed: dict[str, tuple[str, int, str]] = {}
        for page in self.client(self.writer).get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for obj in page.get("Contents", []):
                listed[obj["Key"]] = (obj["ETag"], obj["Size"], obj["LastModified"].isoformat())
        return listed


def _user(iam: Any, name: str, actions: list[str]) -> Keys:
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": actions,
                "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
            }
        ],
    }
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-state", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return Keys(key["AccessKeyId"], key["SecretAccessKey"])


@pytest.fixture
def state_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[StateBucket]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not accepts(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("moto server did not start")
            time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        setup = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        setup |= {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", **setup)
        writer = _user(iam, "proxy-operator", ["s3:*"])
        reader = _user(iam, "proxy-operator-preview", ["s3:GetObject", "s3:ListBucket"])
        # From now on moto checks every request's signature and the user's policy, as AWS does.
        request = urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"0", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        for key, value in writer.env().items():  # the service (this process) writes
            monkeypatch.setenv(key, value)
        yield StateBucket(endpoint=endpoint, writer=writer, reader=reader)
    finally:
        server.terminate()
        server.wait(timeout=10)


# --- the job ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One CI job run of the script: exit code and output."""

    code: int
    stdout: str
    stderr: str


def run_job(manifests: Path, *, work: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> Job:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--manifests", str(manifests), *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return Job(done.returncode, done.stdout, done.stderr)


def github_env(bucket: StateBucket, forge: Forge, work: Path, passphrase: str) -> dict[str, str]:
    """What the workflow gives the script: runner variables, the read-only keys, the passphrase secret."""
    event = work / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": PR}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PROXY_OPERATOR_"))}
    env |= bucket.reader.env() | {"AWS_REGION": "us-east-1"}
    return env | {
        "PULUMI_BACKEND_URL": bucket.backend_url,
        "PULUMI_CONFIG_PASSPHRASE": passphrase,
        "PROXY_OPERATOR": str(PROXY_OPERATOR),
        "GITHUB_ACTIONS": "true",
        "GITHUB_API_URL": forge.url,
        "GITHUB_REPOSITORY": REPO,
        "GITHUB_EVENT_PATH": str(event),
        "GITHUB_SHA": "0123456789abcdef0123456789abcdef01234567",
        "GITHUB_TOKEN": TOKEN,
    }


def ours(forge: Forge) -> list[dict[str, Any]]:
    return [c for c in forge.thread(REPO, PR) if c["body"].startswith(MARKER)]


def pull_request(service: Fleet, root: Path, *, port: int) -> Path:
    """The pull request's manifests: p2 moves to a new port, and a new entry `extra` gets proxy p3."""
    checkout = root / "checkout"
    shutil.copytree(service.manifests, checkout / "proxies")
    manifests = checkout / "proxies"
    catalogue = yaml.safe_load((manifests / "catalogue.yaml").read_text())
    catalogue["providers"].append({"name": "extra", "type": "local", "stateDir": str(root / "extra-state")})
    (manifests / "catalogue.yaml").write_text(yaml.safe_dump(catalogue))
    (manifests / "proxy-p2.yaml").write_text(yaml.safe_dump(proxy_doc("p2", port=port)))
    (manifests / "proxy-p3.yaml").write_text(yaml.safe_dump(proxy_doc("p3", provider="extra", port=port + 1)))
    return manifests


@pytest.mark.engine
def test_pull_request_preview_reads_the_shared_backend_only_and_keeps_one_comment(
    pulumi_env: PulumiEnv, state_bucket: StateBucket, tmp_path: Path
) -> None:
    # The service applied the main branch: stack `local` with p1 and p2, in the shared bucket.
    service = Fleet(root=tmp_path / "service", backend_url=state_bucket.backend_url)
    service.write_proxy("p1", port=free_port())
    service.write_proxy("p2", port=free_port())
    try:
        asyncio.run(service.run(service.apply))
    finally:
        service.kill_proxies()
    before = state_bucket.objects()
    assert ".pulumi/stacks/proxy-operator/local.json" in before
    # The job's credentials really are read-only: a write is refused.
    with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
        state_bucket.client(state_bucket.reader).put_object(Bucket=BUCKET, Key="probe", Body=b"x")

    manifests = pull_request(service, tmp_path, port=free_port())
    work = manifests.parent
    with serve_forge() as forge:
        forge.seed(REPO, PR, [f"review comment {n}" for n in range(100)])  # ours lands on page 2
        env = github_env(state_bucket, forge, work, pulumi_env.passphrase)

        first = run_job(manifests, work=work, env=env)
        assert first.code == 0, first.stderr
        [comment] = ours(forge)
        body = comment["body"]
        assert "| `local` | up | 0 | 0 | 1 | 0 | changes |" in body, body  # p2 replaced
        assert "| `extra` | up | 1 | 0 | 0 | 0 | changes |" in body, body  # the new stack's p3
        assert "`crawl/p3` | create" in body
        assert "0123456789ab" in body  # the commit previewed
        assert first.stdout.startswith("### proxy-operator preview")  # the report is in the job log too

        # The next push: the same comment is edited, not a second one added.
        (manifests / "proxy-p1.yaml").write_text(yaml.safe_dump(proxy_doc("p1", port=free_port())))
        second = run_job(manifests, work=work, env=env)
        assert second.code == 0, second.stderr
        assert [c["id"] for c in ours(forge)] == [comment["id"]]
        assert "| `local` | up | 0 | 0 | 2 | 0 | changes |" in ours(forge)[0]["body"]
        assert ("PATCH", f"/repos/{REPO}/issues/comments/{comment['id']}") in forge.requests

        # An invalid manifest fails the job, and the comment says why.
        (manifests / "proxy-p3.yaml").write_text(
            yaml.safe_dump(proxy_doc("p3", provider="extra", port=free_port(), replicas=3))
        )
        broken = run_job(manifests, work=work, env=env)
        assert broken.code == 1
        [comment] = ours(forge)
        assert "**The preview failed** (exit 1)" in comment["body"]
        assert "replicas" in comment["body"], comment["body"]
        assert len(forge.thread(REPO, PR)) == 101  # the others' comments are untouched
        others = [c["body"] for c in forge.thread(REPO, PR)[:100]]
        assert others == [f"review comment {n}" for n in range(100)]

    # Nothing was written to the shared backend: no stack created (and removed), no lock, no checkpoint.
    assert state_bucket.objects() == before


def test_gitlab_merge_request_note_is_posted_then_updated(tmp_path: Path) -> None:
    """The GitLab flavour of the comment, against the fake notes API (no backend: the manifests are
    invalid the first time, and a stand-in command reports the second time)."""
    manifests = tmp_path / "proxies"
    manifests.mkdir()
    (manifests / "catalogue.yaml").write_text(yaml.safe_dump({"providers": [{"name": "x", "type": "nope"}]}))
    stand_in = tmp_path / "stand-in.py"
    stand_in.write_text("print('### proxy-operator preview\\n\\nall good')\n")
    with serve_forge() as forge:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PROXY_OPERATOR"))}
        env |= {
            "GITLAB_CI": "true",
            "CI_API_V4_URL": f"{forge.url}/api/v4",
            "CI_PROJECT_ID": "42",
            "CI_MERGE_REQUEST_IID": "3",
            "CI_COMMIT_SHA": "fedcba9876543210",
            "GITLAB_TOKEN": TOKEN,
            "PULUMI_CONFIG_PASSPHRASE": "unused",
            "PROXY_OPERATOR": str(PROXY_OPERATOR),
        }
        invalid = run_job(manifests, work=tmp_path, env=env)
        assert invalid.code == 1, invalid.stderr
        [note] = forge.thread("42", 3)
        assert note["body"].startswith(MARKER)
        assert "**The preview failed**" in note["body"]

        env["PROXY_OPERATOR"] = f"{sys.executable} {stand_in}"
        fixed = run_job(manifests, work=tmp_path, env=env)
        assert fixed.code == 0, fixed.stderr
        [note] = forge.thread("42", 3)
        assert "all good" in note["body"]
        assert "failed" not in note["body"]
        assert ("PUT", f"/api/v4/projects/42/merge_requests/3/notes/{note['id']}") in forge.requests


def test_a_report_too_long_for_a_comment_is_cut_and_keeps_the_marker() -> None:
    script = load_script()
    body = script.comment_body(0, "x" * 200_000, "", revision=None, limit=script.MAX_BODY["github"])
    assert len(body) <= 65_536
    assert body.startswith(MARKER)
    assert body.rstrip().endswith("the job log has all of it)*")


def test_without_a_passphrase_the_script_stops_before_previewing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_CONFIG_PASSPHRASE", "PROXY_OP"))}
    job = run_job(tmp_path, work=tmp_path, env=env | {"PROXY_OPERATOR": "/nonexistent/proxy-operator"})
    assert job.code == 2
    assert "PULUMI_CONFIG_PASSPHRASE" in job.stderr
