#!/usr/bin/env bash
# System programs that the make targets need, installed from Debian's packages when missing, so that
# `make run` and `make test` work on a fresh machine with nothing installed by hand.
#
# usage: scripts/install-system-deps.sh base   Python 3.11 with venv (make install / make run)
#        scripts/install-system-deps.sh test   what the tests start or call (make test)
#        scripts/install-system-deps.sh kvm    the test KVM host and make kvm-image (part of test)
#        scripts/install-system-deps.sh bench  the daemons the benchmarks measure ours against (make bench)
# As root it runs apt-get; otherwise `sudo -n apt-get` when sudo needs no password; else it stops with the
# command to run, naming each package. Idempotent and quick: with everything present it only looks.
set -euo pipefail

say() { printf '[system] %s\n' "$*"; }
die() { printf '[system] error: %s\n' "$*" >&2; exit 1; }

python=${PYTHON:-python3.11}
policy=${PROXY_OPERATOR_POLICY_RC_D:-/usr/sbin/policy-rc.d}
deny_daemons=0  # 1: install under a deny-all policy-rc.d, so no postinst starts the daemon it installs
need=()   # Debian packages to install
why=()    # one line each: program -> package, and what uses it

want() {  # want PROGRAM PACKAGE WHAT-USES-IT
  command -v "$1" >/dev/null 2>&1 && return 0
  need+=("$2")
  why+=("$1 (Debian package $2): $3")
}

want_file() {  # want_file PATH PACKAGE WHAT-USES-IT: a data file, not a program
  [ -e "$1" ] && return 0
  need+=("$2")
  why+=("$1 (Debian package $2): $3")
}

want_pc() {  # want_pc PKG-CONFIG-NAME PACKAGE WHAT-USES-IT: C headers and library found by pkg-config
  want pkg-config pkg-config "$3"
  command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$1" && return 0
  need+=("$2")
  why+=("$1.pc (Debian package $2): $3")
}

base() {
  want "$python" "${python}" "the virtual environment (.venv)"
  if command -v "$python" >/dev/null 2>&1 && ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    need+=("${python}-venv")
    why+=("$python -m venv (Debian package ${python}-venv): the virtual environment (.venv)")
  fi
}

tests() {  # redis-server, containerd, podman, libvirtd and sshd would start as services on a systemd host: the tests
  # start their own
  deny_daemons=1
  want redis-server redis-server "the discovery store tests (tests/service/conftest.py starts one on loopback)"
  want pgrep procps "the real-engine tests find the local proxies they started"
  want ssh-keygen openssh-client "tests/stacks/test_kvm_ssh_secret.py makes a test key"
  want openssl openssl "tests/service/test_health_probe.py makes a self-signed certificate"
  want nft nftables "tests/security/test_netns_egress.py loads the VMs' egress rules in a network namespace"
  want ip iproute2 "tests/security/test_netns_egress.py gives the namespace its test-owned addresses"
  want unshare util-linux "tests/security/test_netns_egress.py makes the network namespace"
  want setpriv util-linux "tests/security/test_netns_egress.py connects as the proxy daemon's user"
  want containerd containerd "tests/kube/node.py: the test node's container runtime (CRI)"
  want runc runc "containerd runs the test node's pods with it (crun refuses the hybrid cgroup layout)"
  want "${PROXY_OPERATOR_CNI_DIR:-/usr/lib/cni}/bridge" containernetworking-plugins "the test node's pod network (bridge, host-local, portmap)"
  want conntrack conntrack "kube-proxy on the test node clears stale UDP conntrack entries"
  want ipset ipset "kube-router enforces NetworkPolicy on the test node with ipsets"
  want iptables iptables "kube-router's NetworkPolicy rules on the test node"
  want gcc gcc "the test node's pause image is a static C binary (tests/kube/images.py)"
  want podman podman "make image builds the service image from the Dockerfile without a registry"
  want newuidmap uidmap "podman's user namespaces (make image)"
  want chromium chromium "tests/service/ui/test_browser.py shows the fleet page in a headless browser"
  want chromedriver chromium-driver "Selenium drives that chromium (tests/service/ui/browser.py)"
  kvm
}

kvm() {  # the test KVM host (tests/kvm/host.py starts its own libvirtd, virtlogd and sshd in a namespace)
  deny_daemons=1
  want mmdebstrap mmdebstrap "make image and make kvm-image: the service image's base and the guest images, from Debian's packages"
  want libvirtd libvirt-daemon-system "tests/kvm/host.py: the test KVM host's libvirtd and virtlogd"
  want virsh libvirt-clients "the SSH side of qemu+libssh URIs (virt-ssh-helper) and checks by hand"
  want qemu-system-x86_64 qemu-system-x86 "the test KVM host's guests (TCG: domain type qemu)"
  want qemu-img qemu-utils "make kvm-image (scripts/build-kvm-image.sh) and the pool's volumes"
  want dnsmasq dnsmasq-base "DHCP on the test KVM host's default NAT network"
  want sshd openssh-server "tests/kvm/host.py: the SSH server the service reaches libvirtd through"
  want genisoimage genisoimage "the guests' NoCloud cidata disks (tests/kvm)"
  want extlinux extlinux "make kvm-image: the guest image's boot loader"
  want_file "${PROXY_OPERATOR_SYSLINUX_DIR:-/usr/lib/syslinux}/mbr/mbr.bin" syslinux-common "make kvm-image: the guest image's MBR boot code"
  want sfdisk fdisk "make kvm-image: the guest image's partition table"
  want_pc libvirt libvirt-dev "libvirt-python (the [kvm] extra) builds from source against it"
}

bench() {  # the benchmark starts its own copies on loopback: none may be left running as a service
  deny_daemons=1
  want tinyproxy tinyproxy "tests/bench/bench_forward_proxy.py measures our forward proxy against it (HTTP)"
  want danted dante-server "tests/bench/bench_forward_proxy.py measures our forward proxy against it (SOCKS5)"
  want wrk wrk "tests/bench/bench_discovery.py loads the lease API with it (a C generator; else only its asyncio one)"
}

case "${1:-}" in
  base) base ;;
  test) base; tests ;;
  kvm) base; kvm ;;
  bench) base; bench ;;
  *) die "usage: $0 base|test|kvm|bench" ;;
esac
((${#need[@]})) || exit 0

for line in "${why[@]}"; do say "missing $line"; done
mapfile -t packages < <(printf '%s\n' "${need[@]}" | sort -u)
command -v apt-get >/dev/null 2>&1 ||
  die "no apt-get here: install ${packages[*]} (or what provides them on this system) and run make again"
if [ "$(id -u)" -eq 0 ]; then
  root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  root=(sudo -n)
else
  die "not root, and sudo asks for a password: run  sudo apt-get install -y ${packages[*]}  then make again"
fi
apt=("${root[@]}" apt-get)
if ((deny_daemons)) && [ ! -e "$policy" ]; then  # one already there (a container's) is left as it is
  # On a systemd host the units are still enabled for the next boot (deb-systemd-helper ignores the policy).
  "${root[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > '$policy' && chmod 755 '$policy'" ||
    die "cannot write $policy: install ${packages[*]} by hand, then stop the daemons their packages start"
  trap '"${root[@]}" rm -f "$policy"' EXIT
fi
say "installing ${packages[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
"${apt[@]}" update -qq || die "apt-get update failed: run  apt-get install -y ${packages[*]}  by hand"
"${apt[@]}" install -y -qq --no-install-recommends "${packages[@]}" >/dev/null ||
  die "apt-get install ${packages[*]} failed (see above); install them by hand and run make again"
for package in "${packages[@]}"; do say "installed $package"; done
