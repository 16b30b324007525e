"""The Pulumi program named by Pulumi.yaml (`main: stacks/`): one stack per provider catalogue entry.

Input (stack config, namespace `proxy-operator`):
- `provider`: the catalogue entry as JSON (by alias);
- `proxies`: JSON list of {"namespace", "name", "labels", "spec"} (spec by alias);
- `credentials` (secret): {"ns/name": {"username", "password"}} for proxies whose auth mode is `secret`;
- `providerCredentials` (secret, optional): the GCP service-account key JSON or the kubeconfig;
- `probeUrl` (optional, else $PROXY_OPERATOR_PROBE_URL): the health probe's URL, allowed through every
  proxy's egress policy;
- `kvmSshDir` (optional): where the SSH key and known_hosts are mounted (else $PROXY_OPERATOR_KVM_SSH_DIR);
- `installation` (set by the automation, optional): this installation's id, a label on every resource;
- `specHash`, `stack` (set by the automation): the stack spec hash, echoed back as an output.
Output: `proxies` = {"ns/name": {"host", "port", "protocol", "instanceId"}}, secret `credentials`,
`specHash` and `appliedProxies` (the automation's `specHash` and `proxies` config, echoed back).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

# The language host runs this file with stacks/ as the working directory and first import path; the
# package imports below need the repository root instead.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pulumi  # noqa: E402
from pydantic import TypeAdapter, ValidationError  # noqa: E402

from stacks.models import ProviderEntry  # noqa: E402
from stacks.programs import build_stack  # noqa: E402
from stacks.programs.component import InvalidInputError, ProgramProxy  # noqa: E402
from stacks.programs.context import DEFAULT_KVM_SSH_DIR, ProgramSettings  # noqa: E402
from stacks.programs.probe_allow import PROBE_URL_ENV, ProbePods  # noqa: E402


def _settings(config: pulumi.Config) -> ProgramSettings:
    return ProgramSettings(
        stack=pulumi.get_stack(),
        # The project root is the stack's work directory (writable); a host that does not report it gets
        # a temp folder rather than the (possibly read-only) source tree.
        root_dir=pulumi.get_root_directory() or os.path.join(tempfile.gettempdir(), "proxy-operator"),
        provider_credentials=config.get_secret("providerCredentials"),
        kvm_ssh_dir=config.get("kvmSshDir")
        or os.environ.get("PROXY_OPERATOR_KVM_SSH_DIR", DEFAULT_KVM_SSH_DIR),
        probe_url=config.get("probeUrl") or os.environ.get(PROBE_URL_ENV),
        probe_pods=ProbePods.parse(config.get("probePods") or ""),
        installation=config.get("installation") or None,
    )


def main() -> None:
    config = pulumi.Config("proxy-operator")
    try:
        entry = TypeAdapter(ProviderEntry).validate_json(config.require("provider"))
    except ValidationError as exc:
        raise InvalidInputError(f"invalid configuration proxy-operator:provider: {exc}") from exc
    proxies = [ProgramProxy.from_config(item) for item in json.loads(config.get("proxies") or "[]")]
    # Plain read of a secret value: each value is re-wrapped as a secret Output where it is used.
    given_credentials = json.loads(config.get("credentials") or "{}")
    outputs = build_stack(
        entry=entry, proxies=proxies, given_credentials=given_credentials, settings=_settings(config)
    )
    pulumi.export("proxies", outputs.proxies)
    pulumi.export("credentials", outputs.credentials)
    # Read back by the reconciler: the hash of what this run applied (a restart with no change runs no
    # `up`), and the applied proxies (last good versions, kept in the stack if an edit turns one invalid).
    pulumi.export("specHash", config.get("specHash") or "")
    pulumi.export("appliedProxies", json.loads(config.get("proxies") or "[]"))


main()
