"""Proxy credentials that a VM reads at boot instead of carrying them in its metadata (issue 11).

The setup script is rendered with placeholder credentials; `fetched_at_boot` puts a fetch step in front
that sets `PROXY_USERNAME` and `PROXY_PASSWORD` (and refuses anything outside the safe character set), and
makes the daemon's files take them from those variables. On GCP the fetch reads a Secret Manager version
with the VM's own service-account token from the metadata server, as root, before the egress rules load
(they bind the daemon's user only, which cannot reach the metadata server). On KVM the fetch reads a 0600
file that the program wrote into the guest through the host's libvirt guest agent (`kvm_credentials`).
"""

from __future__ import annotations

from stacks.programs.component import Credentials

USER_MARK, PASSWORD_MARK = "@PROXY_USERNAME@", "@PROXY_PASSWORD@"
PLACEHOLDER = Credentials(username=USER_MARK, password=PASSWORD_MARK)
TINYPROXY_CONF = "/etc/tinyproxy/tinyproxy.conf"
_METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
_JSON = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"access_token\"])'"
_PAYLOAD = (
    'python3 -c \'import base64,json,sys; print(base64.b64decode(json.load(sys.stdin)["payload"]["data"])'
    ".decode())'"
)


def gcp_secret_fetch(version_name: str) -> str:
    """Bash reading `user:password` from the Secret Manager version `projects/*/secrets/*/versions/N`."""
    return (
        f"TOKEN=$(curl -sf -H 'Metadata-Flavor: Google' {_METADATA_TOKEN} | {_JSON})\n"
        f'CREDS=$(curl -sf -H "Authorization: Bearer ${{TOKEN}}" '
        f'"https://secretmanager.googleapis.com/v1/{version_name}:access" | {_PAYLOAD})\n'
        "unset TOKEN\n" + _split_credentials()
    )


def file_fetch(path: str) -> str:
    """Bash reading `user:password` from a root-only file inside the VM."""
    return f"CREDS=$(cat {path})\n" + _split_credentials()


def _split_credentials() -> str:
    safe = "[A-Za-z0-9._-]{1,128}"
    return (
        'PROXY_USERNAME="${CREDS%%:*}"; PROXY_PASSWORD="${CREDS#*:}"; unset CREDS\n'
        f'if ! [[ "${{PROXY_USERNAME}}:${{PROXY_PASSWORD}}" =~ ^{safe}:{safe}$ ]]; then\n'
        '  echo "proxy-operator: the fetched credentials are not usable" >&2; exit 1\n'
        "fi\n"
    )


def fetched_at_boot(script: str, fetch: str) -> str:
    """`script` (rendered with PLACEHOLDER credentials) reading them from the variables `fetch` sets."""
    sed = f'sed -i "s/{USER_MARK}/${{PROXY_USERNAME}}/;s/{PASSWORD_MARK}/${{PROXY_PASSWORD}}/" '
    body = script.replace(
        f"chown root:tinyproxy {TINYPROXY_CONF}.new",
        f"{sed}{TINYPROXY_CONF}.new\n" + f"chown root:tinyproxy {TINYPROXY_CONF}.new",
        1,
    )
    body = body.replace(f"'{PASSWORD_MARK}'", '"${PROXY_PASSWORD}"').replace(
        f'"{USER_MARK}:', '"${PROXY_USERNAME}:'
    )
    marker = "export DEBIAN_FRONTEND=noninteractive\n"
    head, _, rest = body.partition(marker)
    return head + marker + fetch + rest
