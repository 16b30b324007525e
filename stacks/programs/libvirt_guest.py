"""Waiting for a started domain's address: its DHCP lease on the libvirt network, or what its guest agent
reports, polled once a second up to a deadline.

A domain that goes `paused` while it boots cannot run on the host; waiting would only end at the deadline.
With domain type `kvm` that is the accelerator refusing the guest (QEMU's "emulation failure", seen on a
paravirtual /dev/kvm), so the error says at once what to change: `domainType: qemu` in the catalogue entry
(software emulation). A paused domain of type `qemu`, or one paused on a disk error, says why it paused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from stacks.programs.libvirt_conn import libvirt_module

POLL_SECONDS = 1.0
AGENT_TIMEOUT_SECONDS = 2


class GuestStartError(RuntimeError):
    """The domain cannot run, stopped, or got no address in time; the message says which and what to do."""


def paused_message(name: str, *, domain_type: str, reason: int) -> str:
    libvirt = libvirt_module()
    if reason == libvirt.VIR_DOMAIN_PAUSED_IOERROR:
        return f"the domain {name} paused on a disk I/O error: is the host's storage pool full?"
    if domain_type == "kvm":
        return (
            f"the domain {name} paused as it started (reason {reason}): this host's KVM cannot run the guest "
            "(QEMU's 'emulation failure'; no hardware virtualisation, or a paravirtual /dev/kvm): set "
            "domainType: qemu in the catalogue entry to run its guests in software (TCG, slower)"
        )
    return f"the domain {name} paused as it started (reason {reason}); see its QEMU log on the host"


def _ipv4(found: dict[str, Any]) -> str | None:
    libvirt = libvirt_module()
    for interface in found.values():
        for address in interface.get("addrs") or []:
            if address.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and not address["addr"].startswith(
                "127."
            ):
                return str(address["addr"])
    return None


def current_address(domain: Any) -> str | None:
    """The first IPv4 address of its DHCP lease, else of its guest agent's answer; None while neither has."""
    libvirt = libvirt_module()
    found = _ipv4(domain.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0))
    if found:
        return found
    try:
        return _ipv4(domain.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0))
    except libvirt.libvirtError:  # no agent (yet)
        return None


def check_running(domain: Any, *, domain_type: str) -> None:
    libvirt = libvirt_module()
    state, reason = domain.state()
    if state == libvirt.VIR_DOMAIN_PAUSED:
        raise GuestStartError(paused_message(domain.name(), domain_type=domain_type, reason=reason))
    if state != libvirt.VIR_DOMAIN_RUNNING:
        raise GuestStartError(
            f"the domain {domain.name()} stopped while it booted (state {state}, reason {reason})"
        )


def wait_for_address(
    domain: Any,
    *,
    domain_type: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The domain's address once it has one; GuestStartError as soon as it pauses or stops, or at timeout."""
    _short_agent_calls(domain)
    deadline = clock() + timeout
    while True:
        check_running(domain, domain_type=domain_type)
        address = current_address(domain)
        if address:
            return address
        if clock() >= deadline:
            raise GuestStartError(
                f"the domain {domain.name()} got no address within {timeout:.0f} s: no DHCP lease on its "
                "network and no answer from its guest agent; check the network's DHCP range and the guest's "
                "console (`virsh console`, or its log under /var/log/libvirt/qemu on the host)"
            )
        sleep(POLL_SECONDS)


def _short_agent_calls(domain: Any) -> None:
    """A guest agent that is connected but busy must not hold the poll (libvirt's default is to block)."""
    # An older libvirt or a driver without agents refuses it: the lease still answers.
    with contextlib.suppress(Exception):
        domain.agentSetResponseTimeout(AGENT_TIMEOUT_SECONDS, 0)
