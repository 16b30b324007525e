"""Proxy daemon configuration for VMs: tinyproxy (HTTP + CONNECT) or dante (SOCKS5) on Debian.

One idempotent shell script installs the daemon and writes its configuration (port, credentials, one allow
rule per source range) and the egress policy as nftables rules for the daemon's user (`vm_egress`). GCP
runs it as the startup script (at every boot); KVM writes it with cloud-init and runs it once. Credentials
are restricted to a character set that needs no quoting in any of these files. SOCKS users are proxy-level
(a PAM password file read by dante only), never system accounts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from stacks.egress import METADATA_ADDRESSES, denied_ranges
from stacks.models import EgressSpec
from stacks.programs.component import Credentials, InvalidInputError
from stacks.programs.vm_egress import RULES_PATH, nft_rules, nft_steps

SAFE_CREDENTIAL = re.compile(r"[A-Za-z0-9._-]{1,128}")
SETUP_PATH = "/usr/local/sbin/proxy-operator-setup"
DANTE_USER = "proxy-egress"  # dante's unprivileged user: its outgoing connections are what nftables judges
SOCKS_PASSWD = "/etc/proxy-operator/socks.passwd"
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
    # CONNECT only to the allowed ports (nftables refuses the rest anyway); a rule without ports needs all.
    if all(rule.ports for rule in settings.egress.allow):
        ports = sorted(
            {*settings.egress.allow_ports, *(p for rule in settings.egress.allow for p in rule.ports)}
        )
        lines += [f"ConnectPort {port}" for port in ports]
    # With no Allow line tinyproxy admits everyone; the model already refused "open and without credentials".
    lines += [f"Allow {cidr}" for cidr in settings.allowed_source_ranges]
    return "\n".join(lines) + "\n"


def _dante_destinations(settings: ProxySettings, source: str) -> list[str]:
    """dante's socks rules in the order of `stacks.egress.decide` (nftables judges the resolved address)."""
    egress = settings.egress
    lines = [
        f"socks block {{ from: 0/0 to: {address}/{32 if '.' in address else 128} }}"
        for address in METADATA_ADDRESSES
    ]
    for rule in egress.allow:
        ports = [f" port = {port}" for port in rule.ports] or [""]
        lines += [f"socks pass {{ from: {source} to: {rule.cidr}{port} }}" for port in ports]
    lines += [f"socks block {{ from: 0/0 to: {cidr} }}" for cidr in denied_ranges(4) + denied_ranges(6)]
    lines += [f"socks pass {{ from: {source} to: 0/0 port = {port} }}" for port in egress.allow_ports]
    return [*lines, "socks block { from: 0/0 to: 0/0 }"]


def danted_conf(settings: ProxySettings) -> str:
    method = "pam.username" if settings.credentials else "none"
    sources = settings.allowed_source_ranges or ("0.0.0.0/0", "::/0")
    lines = [
        "# Written by proxy-operator; rewritten by its setup script.",
        "logoutput: syslog",
        f"internal: 0.0.0.0 port = {settings.port}",
        "external: @EXTERNAL_INTERFACE@",
        "clientmethod: none",
        f"socksmethod: {method}",
        "pam.servicename: sockd",
        "user.privileged: root",
        f"user.unprivileged: {DANTE_USER}",
    ]
    lines += [f"client pass {{ from: {cidr} to: 0/0 }}" for cidr in sources]
    for cidr in sources:
        lines += _dante_destinations(settings, cidr)
    return "\n".join(dict.fromkeys(lines)) + "\n"


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


def _socks_users(credentials: Credentials) -> str:
    # Proxy-level users: a password file that only PAM's pam_pwdfile (for dante) reads; no system account.
    return (
        _install("libpam-pwdfile")
        + "install -d -m 0700 /etc/proxy-operator\n"
        + f"HASH=$(openssl passwd -6 '{credentials.password}')\n"
        + f'(umask 077; echo "{credentials.username}:$HASH" > {SOCKS_PASSWD}.new)\n'
        + f"mv {SOCKS_PASSWD}.new {SOCKS_PASSWD}\n"
        + _heredoc(
            "/etc/pam.d/sockd",
            f"auth required pam_pwdfile.so pwdfile={SOCKS_PASSWD}\naccount required pam_permit.so\n",
        )
    )


def _dante_steps(settings: ProxySettings) -> str:
    steps = _install("dante-server")
    steps += (
        f"id -u {DANTE_USER} >/dev/null 2>&1 \\\n"
        f"  || useradd --system --no-create-home --shell /usr/sbin/nologin {DANTE_USER}\n"
    )
    if settings.credentials:
        steps += _socks_users(settings.credentials)
    return (
        steps
        + "EXTERNAL_INTERFACE=$(ip -o route show default | awk '{print $5; exit}')\n"
        + _heredoc("/etc/danted.conf.in", danted_conf(settings))
        + 'sed "s/@EXTERNAL_INTERFACE@/${EXTERNAL_INTERFACE}/" /etc/danted.conf.in > /etc/danted.conf\n'
        + "chmod 0644 /etc/danted.conf && rm -f /etc/danted.conf.in\n"
        + "systemctl enable danted\nsystemctl restart danted\n"
    )


def _egress_steps(settings: ProxySettings) -> str:
    user = DANTE_USER if settings.protocol == "socks5" else "tinyproxy"
    rules = _heredoc(f"{RULES_PATH}.in", nft_rules(settings.egress, user=user))
    return _install("nftables") + nft_steps(settings.egress, user=user, heredoc=rules)


def setup_script(settings: ProxySettings) -> str:
    """Bash for Debian: install the daemon if missing, write its configuration, restart it."""
    daemon = _dante_steps(settings) if settings.protocol == "socks5" else _tinyproxy_steps(settings)
    # The daemon's user exists once its package is installed; its rules load before it serves anyone.
    steps = daemon.replace("systemctl restart", _egress_steps(settings) + "systemctl restart", 1)
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
    """The setup script, written and run once per instance: for a proxy without credentials."""
    return cloud_init_document(
        hostname=hostname, files={SETUP_PATH: setup_script(settings)}, runcmd=[[SETUP_PATH]]
    )


def cloud_init_document(
    *, hostname: str, files: dict[str, str], runcmd: list[list[str]], packages: tuple[str, ...] = ()
) -> str:
    """`#cloud-config` writing root-only executables `files` (path: content) and running `runcmd`."""
    document: dict[str, object] = {
        "hostname": hostname,
        "write_files": [
            {"path": path, "permissions": "0700", "owner": "root:root", "content": content}
            for path, content in files.items()
        ],
    }
    if packages:
        document |= {"package_update": True, "packages": list(packages)}
    document["runcmd"] = runcmd
    return "#cloud-config\n" + yaml.dump(document, Dumper=_LiteralDumper, sort_keys=False)


def cloud_init_meta_data(*, instance_id: str, hostname: str) -> str:
    return f"instance-id: {instance_id}\nlocal-hostname: {hostname}\n"
