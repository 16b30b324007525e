#!/usr/bin/env bash
# The Secret that the kvm provider type mounts at /etc/proxy-operator/kvm: the SSH private key (id_ed25519)
# and the known_hosts file recorded under the exact addresses of the catalogue's qemu+ssh URIs.
#
# usage: scripts/kvm-ssh-secret.sh [--apply]     (make kvm-ssh-secret)
#   prints the manifest; --apply (or KVM_SSH_APPLY=1) applies it with kubectl instead.
# overrides: KVM_SSH_KEY      private key        (default ~/.ssh/id_ed25519)
#            KVM_KNOWN_HOSTS  known_hosts file   (default ~/.ssh/kvm_known_hosts)
#            KVM_SSH_SECRET   Secret name        (default kvm-ssh, the catalogue's sshSecret)
#            KVM_SSH_NAMESPACE                   (default proxy-operator, where the service runs)
set -euo pipefail

key=${KVM_SSH_KEY:-$HOME/.ssh/id_ed25519}
known_hosts=${KVM_KNOWN_HOSTS:-$HOME/.ssh/kvm_known_hosts}
name=${KVM_SSH_SECRET:-kvm-ssh}
namespace=${KVM_SSH_NAMESPACE:-proxy-operator}
apply=${KVM_SSH_APPLY:-0}
[[ "${1:-}" == "--apply" ]] && apply=1

die() { echo "kvm-ssh-secret: $*" >&2; exit 1; }

case "$key" in
  *.pub) die "$key is a public key: give the private key (the same path without .pub), e.g. KVM_SSH_KEY=${key%.pub}" ;;
esac
[[ -r "$key" ]] || die "cannot read the private key $key: set KVM_SSH_KEY to the key made with ssh-keygen -t ed25519"
if ! grep -q -- "-----BEGIN .*PRIVATE KEY-----" "$key"; then
  die "$key is not a private key (a .pub file renamed?): set KVM_SSH_KEY to the private half"
fi
# The libvirt provider cannot ask for a passphrase: an encrypted key would fail at every connection.
if command -v ssh-keygen >/dev/null && ! ssh-keygen -y -P "" -f "$key" >/dev/null 2>&1; then
  die "$key has a passphrase (or is damaged): make a key without one for the service (ssh-keygen -N '')"
fi
[[ -s "$known_hosts" ]] || die "known_hosts $known_hosts is missing or empty: run ssh-keyscan for every host (docs/kvm-provider.md)"

# Rendered here rather than by `kubectl create --dry-run`, so printing it needs no kubectl.
manifest() {
  cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $name
  namespace: $namespace
type: Opaque
data:
  id_ed25519: $(base64 -w0 < "$key")
  known_hosts: $(base64 -w0 < "$known_hosts")
YAML
}

if [[ "$apply" == "1" ]]; then
  command -v kubectl >/dev/null || die "--apply needs kubectl; without it, print the manifest and apply it elsewhere"
  manifest | kubectl apply -f -
else
  manifest
fi
