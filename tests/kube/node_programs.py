"""The command line of each of the test node's programs, in the order tests/kube/node.py starts them.

Flags follow ../shared/notes/kubernetes-node.md (what worked on this machine kind). Every program runs inside
the node's namespaces, so its loopback ports (etcd 2379/2380, kube-proxy 10249/10256, kubelet 10248) are the
namespace's own and clash with nothing on the host.
"""

from __future__ import annotations

from tests.kube.node_config import API_PORT, NODE_IP, NODE_NAME, POD_CIDR, SERVICE_CIDR, NodeFiles

ETCD = "http://127.0.0.1:2379"
ETCD_PEER = "http://127.0.0.1:2380"
ORDER = ("etcd", "kube-apiserver", "containerd", "kube-controller-manager", "kube-scheduler", "kubelet",
         "kube-proxy", "kube-router", "coredns")  # fmt: skip


def flags(name: str, f: NodeFiles) -> list[str]:
    """The arguments of program `name` (one of ORDER)."""
    w, kubeconfig = f.workdir, f.kubeconfigs
    table: dict[str, list[str]] = {
        "etcd": [
            "--name=node", f"--data-dir={w / 'etcd'}", "--logger=zap", "--log-outputs=stderr",
            f"--listen-client-urls={ETCD}", f"--advertise-client-urls={ETCD}",
            f"--listen-peer-urls={ETCD_PEER}",
            f"--initial-advertise-peer-urls={ETCD_PEER}", f"--initial-cluster=node={ETCD_PEER}",
        ],
        "kube-apiserver": [
            f"--etcd-servers={ETCD}", f"--secure-port={API_PORT}", f"--bind-address={NODE_IP}",
            f"--advertise-address={NODE_IP}", f"--cert-dir={f.certs}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={f.sa_pub}",
            f"--service-account-signing-key-file={f.sa_key}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", f"--token-auth-file={f.tokens}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={f.kubelet_client_cert}",
            f"--kubelet-client-key={f.kubelet_client_key}",
            f"--audit-policy-file={f.audit_policy}", f"--audit-log-path={f.audit_log}",
        ],
        "containerd": [f"--config={f.containerd}"],
        "kube-controller-manager": [
            f"--kubeconfig={kubeconfig['system:kube-controller-manager']}",
            "--use-service-account-credentials",
            f"--root-ca-file={f.ca_file}", f"--service-account-private-key-file={f.sa_key}",
            "--leader-elect=false", "--secure-port=0", "--allocate-node-cidrs", f"--cluster-cidr={POD_CIDR}",
            "--node-cidr-mask-size=24", f"--service-cluster-ip-range={SERVICE_CIDR}",
        ],
        "kube-scheduler": [
            f"--kubeconfig={kubeconfig['system:kube-scheduler']}", "--leader-elect=false", "--secure-port=0",
        ],
        "kubelet": [
            f"--config={f.kubelet}", f"--kubeconfig={kubeconfig[f'system:node:{NODE_NAME}']}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
            f"--root-dir={w / 'kubelet' / 'root'}",
            f"--cert-dir={w / 'kubelet' / 'pki'}",
        ],
        "kube-proxy": [f"--config={f.kube_proxy}"],
        # TEST-ONLY (reported flaws at v2.1.0): NetworkPolicy enforcement, nothing else; its --cleanup-config
        # panics here (no IPVS), and its iptables rules and ipsets die with the node's network namespace
        "kube-router": [
            f"--kubeconfig={kubeconfig['pon:kube-router']}", f"--hostname-override={NODE_NAME}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--metrics-port=0",
        ],
        "coredns": [f"-conf={f.corefile}"],
    }  # fmt: skip
    return table[name]
