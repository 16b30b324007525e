#!/usr/bin/env python3
"""Preview a pull request's Proxy manifests and post the result as ONE comment on it, updated on every push.

Runs `proxy-operator preview --manifests DIR --markdown`: only the stacks whose manifests differ from what
the backend last applied are previewed, i.e. the stacks the pull request touches. The Markdown report is
posted on the pull request (GitHub) or merge request (GitLab). The comment starts with a hidden HTML
marker; the next run finds it by that marker and edits it instead of adding another one. The script exits
with preview's exit code, so an invalid manifest (or a stack whose preview failed) fails the job, after the
comment says why.

Standard library only: copy this file into the repository that holds the manifests. Environment:

  the backend, as for any proxy-operator command: PULUMI_BACKEND_URL (s3://..., gs://...), the cloud's
  read-only credentials, PULUMI_CONFIG_PASSPHRASE (or PROXY_OPERATOR_PASSPHRASE_FILE) from a CI secret
  PROXY_OPERATOR         the command to run (default: proxy-operator on PATH)
  GitHub Actions:        GITHUB_TOKEN; GITHUB_REPOSITORY, GITHUB_EVENT_PATH, GITHUB_API_URL, GITHUB_SHA
                         are set by the runner (PR_NUMBER overrides the event's pull request number)
  GitLab CI:             GITLAB_TOKEN (a project access token, scope `api`); CI_API_V4_URL, CI_PROJECT_ID,
                         CI_MERGE_REQUEST_IID, CI_COMMIT_SHA are set by the runner

Exit codes: preview's (0 nothing wrong, 1 an invalid manifest or a failed stack preview, 2 a usage or
set-up error), or 3 when the comment could not be posted although the preview succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

MARKER = "<!-- proxy-operator-preview -->"
# GitHub refuses a comment body above 65,536 characters; GitLab allows 1,000,000.
MAX_BODY = {"github": 65_000, "gitlab": 999_000}
PAGE = 100
TIMEOUT = 30


def run_preview(command: list[str], manifests: str, extra: list[str]) -> tuple[int, str, str]:
    argv = [*command, "preview", "--manifests", manifests, "--markdown", *extra]
    print("+", shlex.join(argv), file=sys.stderr, flush=True)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return 2, "", f"cannot run {command[0]!r}: is proxy-operator installed? (set PROXY_OPERATOR)\n"
    return done.returncode, done.stdout, done.stderr


def comment_body(code: int, report: str, errors: str, *, revision: str | None, limit: int) -> str:
    """The comment: marker, the Markdown report (or why there is none), and the errors when it failed."""
    parts = [MARKER]
    if report.strip():
        parts.append(report.rstrip("\n"))
    else:
        parts.append("### proxy-operator preview")
    if code != 0:
        parts.append(
            f"**The preview failed** (exit {code}): an invalid manifest, or a stack that could not be "
            "previewed. Fix what is listed below before merging."
        )
        if errors.strip():
            parts.append(_fence(errors.strip()))
    if revision:
        parts.append(f"<sub>Preview of {revision[:12]}; this comment is updated on every push.</sub>")
    body = "\n\n".join(parts) + "\n"
    if len(body) > limit:
        cut = "\n\n*(cut: the report is longer than a comment may be; the job log has all of it)*\n"
        body = body[: limit - len(cut)] + cut
    return body


def _fence(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}text\n{text}\n{fence}"


# --- the two APIs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thread:
    """Where the comment goes: the API endpoints of one pull (merge) request's comments, and their auth."""

    platform: str
    list_url: str  # GET (paged) and POST
    item_url: str  # PATCH (GitHub) or PUT (GitLab), with {id}
    headers: dict[str, str]
    update_method: str


def github_thread(env: dict[str, str]) -> Thread:
    api = env.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    repo = _need(env, "GITHUB_REPOSITORY")
    number = env.get("PR_NUMBER") or _event_pr_number(env.get("GITHUB_EVENT_PATH"))
    return Thread(
        platform="github",
        list_url=f"{api}/repos/{repo}/issues/{number}/comments",
        item_url=f"{api}/repos/{repo}/issues/comments/{{id}}",
        headers={
            "Authorization": f"Bearer {_need(env, 'GITHUB_TOKEN')}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        },
        update_method="PATCH",
    )


def gitlab_thread(env: dict[str, str]) -> Thread:
    api = _need(env, "CI_API_V4_URL").rstrip("/")
    project = urllib.parse.quote(_need(env, "CI_PROJECT_ID"), safe="")
    iid = _need(env, "CI_MERGE_REQUEST_IID")
    base = f"{api}/projects/{project}/merge_requests/{iid}/notes"
    return Thread(
        platform="gitlab",
        list_url=base,
        item_url=base + "/{id}",
        headers={"PRIVATE-TOKEN": _need(env, "GITLAB_TOKEN")},
        update_method="PUT",
    )


def _event_pr_number(path: str | None) -> str:
    if not path:
        raise SetupError("no pull request number: set PR_NUMBER, or run on a pull_request event")
    with open(path, encoding="utf-8") as handle:
        event = json.load(handle)
    number = (event.get("pull_request") or {}).get("number")
    if number is None:
        raise SetupError(f"the event in {path} is not a pull request: run on pull_request or set PR_NUMBER")
    return str(number)


def _need(env: dict[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise SetupError(f"{name} is not set")
    return value


class SetupError(Exception):
    pass


def request(thread: Thread, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {**thread.headers, "User-Agent": "proxy-operator-preview"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=TIMEOUT) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def find_comment(thread: Thread) -> Any | None:
    """The id of the comment this script posted earlier (its body starts with the marker), if any."""
    page = 1
    while True:
        query = urllib.parse.urlencode({"per_page": PAGE, "page": page})
        comments = request(thread, "GET", f"{thread.list_url}?{query}")
        for comment in comments:
            if str(comment.get("body") or "").startswith(MARKER):
                return comment["id"]
        if len(comments) < PAGE:
            return None
        page += 1


def post_or_update(thread: Thread, body: str) -> str:
    found = find_comment(thread)
    if found is None:
        request(thread, "POST", thread.list_url, {"body": body})
        return "posted a new comment"
    request(thread, thread.update_method, thread.item_url.format(id=found), {"body": body})
    return f"updated comment {found}"


def detect_platform(env: dict[str, str]) -> str:
    if env.get("GITHUB_ACTIONS") == "true":
        return "github"
    if env.get("GITLAB_CI") == "true":
        return "gitlab"
    return "none"


def check_passphrase(env: dict[str, str]) -> str | None:
    """Without a passphrase, proxy-operator would make up one and fail to decrypt the shared stacks."""
    provider = env.get("PROXY_OPERATOR_SECRETS_PROVIDER", "passphrase")
    configured = ("PULUMI_CONFIG_PASSPHRASE", "PROXY_OPERATOR_PASSPHRASE_FILE")
    if provider == "passphrase" and not any(env.get(name) for name in configured):
        return "set PULUMI_CONFIG_PASSPHRASE from a CI secret: the backend's stacks are encrypted with it"
    return None


# --- main ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", required=True, help="Folder of Proxy manifests and the catalogue.")
    parser.add_argument("--all", action="store_true", help="Preview every stack, changed or not.")
    parser.add_argument("--state-dir", help="proxy-operator's work folder (default: its own default).")
    parser.add_argument(
        "--platform", choices=("auto", "github", "gitlab", "none"), default="auto", help="Where to comment."
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)

    problem = check_passphrase(env)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    extra = (["--all"] if args.all else []) + (["--state-dir", args.state_dir] if args.state_dir else [])
    command = shlex.split(env.get("PROXY_OPERATOR", "proxy-operator"))
    code, report, errors = run_preview(command, args.manifests, extra)
    sys.stdout.write(report)
    sys.stderr.write(errors)

    platform = detect_platform(env) if args.platform == "auto" else args.platform
    if platform == "none":
        print("no pull request to comment on (--platform none)", file=sys.stderr)
        return code
    revision = env.get("GITHUB_SHA") or env.get("CI_COMMIT_SHA")
    try:
        thread = github_thread(env) if platform == "github" else gitlab_thread(env)
        body = comment_body(code, report, errors, revision=revision, limit=MAX_BODY[platform])
        print(f"{platform}: {post_or_update(thread, body)}", file=sys.stderr)
    except (SetupError, OSError, ValueError) as exc:  # urllib's errors are OSErrors
        detail = exc.read().decode(errors="replace")[:500] if isinstance(exc, urllib.error.HTTPError) else ""
        print(f"error: cannot comment on the {platform} request: {exc} {detail}".rstrip(), file=sys.stderr)
        return code or 3
    return code


if __name__ == "__main__":
    sys.exit(main())
