"""Proxy daemon configuration for VMs: tinyproxy (HTTP + CONNECT) or dante (SOCKS5) on Debian.

One idempotent shell script installs the daemon and writes its configuration (port, credentials, one allow
rule per source range). GCP runs it as the startup script (at every boot); KVM writes it with cloud-init and
runs it once. Credentials are restricted to a character set that needs no quoting in any of these files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from stacks.models import EgressSpec
from stacks.programs.component import Credentials, InvalidInputError

SAFE_CREDENTIAL = re.compile(r"[A-Za-z0-9._-]{1,128}")
SETUP_PATH = "/usr/local/sbin/proxy-operator-setup"
EOF_MARK = "PROXY_OPERATOR_EOF"


@dataclass(frozen=True)
class ProxySettings:
    port: int
    protocol: str  # "http" or "socks5"
    allowed_source_ranges: tuple[str, ...]
    credentials: Credentials | None
    egress: EgressSpec = field(default_factory=EgressSpec)


def check_credentials(credentials: Credentials, *, where: str) -> Credentials:
    """Refuse characters that tinyproxy's BasicAuth, dante's passwd and pproxy's URI cannot carry."""
    for field_name in ("username", "password"):
        if not SAFE_CREDENTIAL.fullmatch(getattr(credentials, field_name)):
            raise InvalidInputError(
                f"{where}: the {field_name} may hold only letters, digits, '.', '_' and '-' "
                "(1-128 characters); change it in the referenced Secret"
            )
    return credentials


def tinyproxy_conf(settings: ProxySettings) -> str:
    lines = [
        "# Written by proxy-operator; rewritten by its setup script.",
        "User tinyproxy",
        "Group tinyproxy",
        f"Port {settings.port}",
        "Listen 0.0.0.0",
        "Timeout 600",
        "MaxClients 200",
        "LogLevel Notice",
        "Syslog On",
        "DisableViaHeader Yes",
    ]
    if settings.credentials:
        lines.append(f"BasicAuth {settings.credentials.username} {settings.credentials.password}")
    # With no Allow line tinyproxy admits everyone; the model already refused "open and without credentials".
    lines += [f"Allow {cidr}" for cidr in settings.allowed_source_ranges]
    return "\n".join(lines) + "\n"


def danted_conf(settings: ProxySettings) -> str:
    method = "username" if settings.credentials else "none"
    sources = settings.allowed_source_ranges or ("0.0.0.0/0", "::/0")
    lines = [
        "# Written by proxy-operator; rewritten by its setup script.",
        "logoutput: syslog",
        f"internal: 0.0.0.0 port = {settings.port}",
        "external: @EXTERNAL_INTERFACE@",
        "clientmethod: none",
        f"socksmethod: {method}",
        "user.privileged: root",
        "user.unprivileged: nobody",
    ]
    lines += [f"client pass {{ from: {cidr} to: 0/0 }}" for cidr in sources]
    lines += [f"socks pass {{ from: {cidr} to: 0/0 }}" for cidr in sources]
    return "\n".join(lines) + "\n"


def _heredoc(path: str, content: str) -> str:
    return f"cat > {path} <<'{EOF_MARK}'\n{content}{EOF_MARK}\n"


def _install(package: str) -> str:
    return (
        f"if ! dpkg -s {package} >/dev/null 2>&1; then\n"
        "  apt-get update -q\n"
        f"  apt-get install -y -q {package}\n"
        "fi\n"
    )


def _tinyproxy_steps(settings: ProxySettings) -> str:
    conf = "/etc/tinyproxy/tinyproxy.conf"
    return (
        _install("tinyproxy")
        + _heredoc(f"{conf}.new", tinyproxy_conf(settings))
        + f"chown root:tinyproxy {conf}.new && chmod 0640 {conf}.new && mv {conf}.new {conf}\n"
        + "systemctl enable tinyproxy\nsystemctl restart tinyproxy\n"
    )


def _socks_user(credentials: Credentials) -> str:
    # The SOCKS username is a system account: never take over one that this script did not create.
    user = credentials.username
    return (
        "groupadd -f proxy-operator\n"
        f"if id -u {user} >/dev/null 2>&1; then\n"
        f"  id -nG {user} | grep -qw proxy-operator \\\n"
        f"    || {{ echo 'refusing to reuse account {user}' >&2; exit 1; }}\n"
        "else\n"
        f"  useradd --system --no-create-home --shell /usr/sbin/nologin -G proxy-operator {user}\n"
        "fi\n"
        f"echo '{user}:{credentials.password}' | chpasswd\n"
    )


def _dante_steps(settings: ProxySettings) -> str:
    steps = _install("dante-server")
    if settings.credentials:
        steps += _socks_user(settings.credentials)
    return (
        steps
        + "EXTERNAL_INTERFACE=$(ip -o route show default | awk '{print $5; exit}')\n"
        + _heredoc("/etc/danted.conf.in", danted_conf(settings))
        + 'sed "s/@EXTERNAL_INTERFACE@/${EXTERNAL_INTERFACE}/" /etc/danted.conf.in > /etc/danted.conf\n'
        + "chmod 0644 /etc/danted.conf && rm -f /etc/danted.conf.in\n"
        + "systemctl enable danted\nsystemctl restart danted\n"
    )


def setup_script(settings: ProxySettings) -> str:
    """Bash for Debian: install the daemon if missing, write its configuration, restart it."""
    steps = _dante_steps(settings) if settings.protocol == "socks5" else _tinyproxy_steps(settings)
    return "#!/bin/bash\n# proxy-operator proxy setup; safe to run again.\nset -euo pipefail\n" + (
        "export DEBIAN_FRONTEND=noninteractive\n" + steps
    )


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, so the user-data stays readable on the VM."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _represent_str)


def cloud_init_user_data(settings: ProxySettings, *, hostname: str) -> str:
    document = {
        "hostname": hostname,
        "write_files": [
            {
                "path": SETUP_PATH,
                "permissions": "0700",
                "owner": "root:root",
                "content": setup_script(settings),
            }
        ],
        "runcmd": [[SETUP_PATH]],
    }
    return "#cloud-config\n" + yaml.dump(document, Dumper=_LiteralDumper, sort_keys=False)


def cloud_init_meta_data(*, instance_id: str, hostname: str) -> str:
    return f"instance-id: {instance_id}\nlocal-hostname: {hostname}\n"
