"""Offline checks of the Dockerfile, .dockerignore and the image scripts (`make image` builds the real thing).

The image runs non-root with its tools on PATH (never under PULUMI_HOME, an emptyDir in a pod), its version
pins agree with requirements.lock and the tools/ wrapper modules, the build context holds what the Dockerfile
copies and nothing of the checkout's state, and it agrees with deploy/deployment.yaml.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
TOOLS_DIR = "/opt/proxy-operator/bin"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n(\s*#.*\n)*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def arg_defaults() -> dict[str, str]:
    args = [rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest]
    return {name: value.strip('"') for name, value in args}


def env() -> dict[str, str]:
    values: dict[str, str] = {}
    for word, rest in final_stage():
        if word == "ENV":
            values.update(pair.split("=", 1) for pair in shlex.split(rest))
    return values


def locked(package: str) -> str:
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    match = re.search(rf"^{package}==(\S+)$", text, re.MULTILINE)
    assert match, f"{package} is not pinned in requirements.lock"
    return match.group(1)


def deployment_container() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "deployment.yaml").read_text(encoding="utf-8"))
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]


# --- the image ---------------------------------------------------------------------------------------------


def test_it_runs_as_a_non_root_user_that_the_deployment_names() -> None:
    users = [rest for word, rest in final_stage() if word == "USER"]
    assert users == ["10001:10001"]
    pod = deployment_container()
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (10001, 10001)


def test_entrypoint_and_default_command() -> None:
    stage = dict(final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["proxy-operator"]
    assert json.loads(stage["CMD"]) == ["serve"]


def test_tools_are_on_path_and_not_under_the_pulumi_home() -> None:
    values = env()
    path = values["PATH"].split(":")
    assert path[:2] == [TOOLS_DIR, "/opt/proxy-operator/venv/bin"]
    home = values["PULUMI_HOME"]
    assert not any(entry == home or entry.startswith(home + "/") for entry in path)
    copies = [rest for word, rest in final_stage() if word == "COPY" and "--from=pulumi-tools" in rest]
    assert copies == [f"--from=pulumi-tools /out/ {TOOLS_DIR}/"]
    # The package's console scripts are the language host and the dynamic-provider launcher.
    links = " ".join(rest for word, rest in final_stage() if word == "RUN")
    for plugin in ("pulumi-language-python", "pulumi-resource-pulumi-python"):
        assert f"../venv/bin/{plugin}" in links


def test_writable_places_match_the_deployment_empty_dirs() -> None:
    values = env()
    pod = deployment_container()
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    deploy_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert values["PROXY_OPERATOR_STATE_DIR"] in mounts
    assert values["PULUMI_HOME"] == deploy_env["PULUMI_HOME"]
    assert values["PULUMI_HOME"].startswith(values["PROXY_OPERATOR_STATE_DIR"] + "/")
    assert values["PYTHONDONTWRITEBYTECODE"] == "1"  # the root filesystem is read-only


# --- versions ----------------------------------------------------------------------------------------------


def test_tool_versions_agree_with_the_lock() -> None:
    args = arg_defaults()
    assert args["PULUMI_VERSION"] == locked("pulumi")
    assert args["PULUMI_KUBERNETES_VERSION"] == locked("pulumi_kubernetes")
    assert args["PULUMI_GCP_VERSION"] == locked("pulumi_gcp")
    assert "PULUMI_LIBVIRT_VERSION" not in args  # the kvm program needs no plugin (docs/decisions.md)
    assert "kubernetes" in args["PLUGINS"].split()


def test_tool_versions_agree_with_the_wrapper_modules_make_tools_builds() -> None:
    args = arg_defaults()
    cli = (ROOT / "tools" / "pulumi-cli" / "go.mod").read_text(encoding="utf-8")
    plugin = (ROOT / "tools" / "pulumi-kubernetes" / "go.mod").read_text(encoding="utf-8")
    assert f"github.com/pulumi/pulumi/pkg/v3 v{args['PULUMI_VERSION']}" in cli
    assert f"github.com/pulumi/pulumi-kubernetes/sdk/v4 v{args['PULUMI_KUBERNETES_VERSION']}" in plugin


def test_the_venv_is_built_from_the_lock_and_the_package_is_not_editable() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "pip install -q -c requirements.lock -r dependencies.txt" in runs
    assert "pip install -q --no-deps ." in runs
    assert "-e " not in runs
    assert "--editable" not in runs


# --- the build context --------------------------------------------------------------------------------------


def test_the_context_holds_what_the_dockerfile_copies_and_no_checkout_state() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "an allow-list: everything else stays out (.venv, .tools, .state, .git)"
    allowed = {rule.removeprefix("!").rstrip("/") for rule in rules if rule.startswith("!")}
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert source in allowed, f"COPY {source} is kept out by .dockerignore"
                assert (ROOT / source).exists(), source
    assert not allowed & {".venv", ".tools", ".state", ".git", "tests"}


def test_the_build_script_parses() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "build-image.sh")], check=True)


# --- the download stage's script ----------------------------------------------------------------------------


def _bundle(member: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        data = f"binary {member}".encode()
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_the_download_stage_takes_only_the_cli_and_the_named_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fetch", ROOT / "scripts" / "fetch-pulumi-tools.py")
    assert spec
    assert spec.loader
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    asked: list[str] = []

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        asked.append(url)
        member = "pulumi/pulumi" if "/sdk/" in url else url.rsplit("/", 1)[1].split("-v")[0]
        return io.BytesIO(_bundle(member))

    monkeypatch.setattr(fetch.urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("PULUMI_VERSION", "3.260.0")
    monkeypatch.setenv("PLUGINS", "kubernetes")
    monkeypatch.setenv("PULUMI_KUBERNETES_VERSION", "4.25.0")
    monkeypatch.setenv("TARGETARCH", "amd64")
    fetch.main(tmp_path)
    assert asked == [
        "https://get.pulumi.com/releases/sdk/pulumi-v3.260.0-linux-x64.tar.gz",
        "https://get.pulumi.com/releases/plugins/pulumi-resource-kubernetes-v4.25.0-linux-amd64.tar.gz",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pulumi", "pulumi-resource-kubernetes"]
    assert (tmp_path / "pulumi").stat().st_mode & 0o111


def test_the_image_has_ssh_for_the_kvm_credentials() -> None:
    """The kvm program runs `ssh` to deliver proxy credentials to the KVM host: both the users' base and the
    base `make image` builds must provide it."""
    text = DOCKERFILE.read_text()
    final = text[text.rindex("\nFROM ") :]
    assert "openssh-client" in final
    assert "openssh-client" in (ROOT / "scripts" / "build-image.sh").read_text()


def test_the_proxy_pods_default_image_is_this_releases_service_image() -> None:
    """Proxy pods run the forward proxy from the service's own image (docs/decisions.md, "The proxy in pods
    and VMs"): the program's default must name the image deploy/ runs, at pyproject's version, and the image
    must carry the daemon's console script."""
    from stacks.models import DEFAULT_KUBERNETES_IMAGE

    version = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version
    assert deployment_container()["containers"][0]["image"] == DEFAULT_KUBERNETES_IMAGE
    assert DEFAULT_KUBERNETES_IMAGE.endswith(f":{version.group(1)}")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["proxy-operator-forward-proxy"] == "stacks.forward_proxy.__main__:entry"
