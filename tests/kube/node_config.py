"""The test node's addresses, credentials and configuration files (written by `write_node_config`).

Every address is test-owned: the node's network namespace is reached over one veth (host 10.245.0.1, node
10.245.0.2); pods are 10.244.0.0/24 on a bridge inside that namespace; Services 10.245.96.0/24. Nothing here
names an interface or a path outside the fixture's work folder, except the Debian CNI plugins' folder.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

NODE_NAME = "pon-node"
HOST_IP = "10.245.0.1"  # the host's end of the veth: test servers listen here
NODE_IP = "10.245.0.2"  # the node's end: apiserver, kubelet, CoreDNS
VETH_PREFIX = 30
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.245.96.0/24"
DNS_IP = NODE_IP  # CoreDNS runs as a process in the node's namespace, on the node address
API_PORT = 6443
CGROUP_PARENT = (
    "pon-node"  # kubelet's cgroupRoot: every pod cgroup is under /sys/fs/cgroup/<controller>/pon-node
)
CNI_BIN = "/usr/lib/cni"  # Debian's containernetworking-plugins
USERS = {  # token-file users: name -> group (the default RBAC bindings name these users)
    "admin": "system:masters",
    f"system:node:{NODE_NAME}": "system:nodes",
    "system:kube-proxy": "",
    "system:kube-controller-manager": "",
    "system:kube-scheduler": "",
    "pon:kube-router": "",  # these two read what READ_ONLY_ROLES grants them, nothing more
    "pon:coredns": "",
}
_WATCH = ["get", "list", "watch"]
READ_ONLY_ROLES = {  # user -> the rules of its ClusterRole (bound by node.py once the apiserver answers)
    "pon:kube-router": [
        {
            "apiGroups": [""],
            "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
            "verbs": _WATCH,
        },
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _WATCH},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _WATCH},
    ],
    "pon:coredns": [
        {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "endpoints"], "verbs": _WATCH},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _WATCH},
    ],
}


@dataclass(frozen=True)
class NodeFiles:
    """Where `write_node_config` put everything; `kubeconfigs` by user name."""

    workdir: Path
    tokens: Path
    sa_key: Path
    sa_pub: Path
    certs: (
        Path  # kube-apiserver's --cert-dir: apiserver.crt is the self-signed serving certificate (its own CA)
    )
    kubelet_ca: Path
    kubelet_client_cert: Path
    kubelet_client_key: Path
    kubeconfigs: dict[str, Path]
    containerd: Path
    containerd_socket: Path
    kubelet: Path
    kube_proxy: Path
    corefile: Path

    @property
    def ca_file(self) -> Path:
        return self.certs / "apiserver.crt"

    @property
    def audit_policy(self) -> Path:
        return self.workdir / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines, Metadata level): what the tests' users asked of it."""
        return self.workdir / "logs" / "audit.log"


def write_node_config(workdir: Path, *, images: dict[str, str]) -> NodeFiles:
    """Every file the node's programs read, under `workdir`; `images` names the pause image ("pause")."""
    for sub in ("certs", "kubeconfig", "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    tokens = {user: secrets.token_urlsafe(24) for user in USERS}
    (workdir / "tokens.csv").write_text(
        "".join(f"{tokens[u]},{u},{u}-uid{',' + g if g else ''}\n" for u, g in USERS.items())
    )
    (workdir / "tokens.csv").chmod(0o600)
    certs = workdir / "certs"
    url = f"https://{NODE_IP}:{API_PORT}"
    kubeconfigs = {
        user: write_kubeconfig(
            workdir / "kubeconfig" / f"{user.replace(':', '-')}.yaml", url, certs, tokens[user]
        )
        for user in USERS
    }
    sa_key, sa_pub = write_key_pair(workdir / "sa")
    kubelet_ca, client_cert, client_key = write_kubelet_client(workdir / "certs")
    socket = workdir / "containerd" / "containerd.sock"
    files = NodeFiles(
        workdir=workdir, tokens=workdir / "tokens.csv", sa_key=sa_key, sa_pub=sa_pub, certs=certs,
        kubelet_ca=kubelet_ca, kubelet_client_cert=client_cert, kubelet_client_key=client_key,
        kubeconfigs=kubeconfigs, containerd=workdir / "containerd" / "config.toml", containerd_socket=socket,
        kubelet=workdir / "kubelet" / "config.yaml", kube_proxy=workdir / "kube-proxy.yaml",
        corefile=workdir / "Corefile",
    )  # fmt: skip
    files.containerd.write_text(containerd_toml(workdir, images["pause"]))
    (workdir / "cni/net.d/10-pon.conflist").write_text(json.dumps(cni_conflist(workdir), indent=1))
    files.kubelet.write_text(yaml.safe_dump(kubelet_config(files)))
    files.kube_proxy.write_text(yaml.safe_dump(kube_proxy_config(files)))
    files.corefile.write_text(corefile(files))
    files.audit_policy.write_text(yaml.safe_dump(audit_policy()))
    return files


def audit_policy() -> dict[str, object]:
    """Metadata level for every request once answered, except the node's own programs (USERS but admin) and
    the apiserver's own loopback client, whose status updates, leases and watches would fill the log; the
    controller-manager's controllers (ServiceAccounts of kube-system) are kept."""
    components = [user for user in USERS if user != "admin"] + ["system:apiserver"]
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "None", "users": components}, {"level": "Metadata"}],
    }


def write_kubeconfig(path: Path, url: str, certs: Path, token: str) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "node",
                "cluster": {"server": url, "certificate-authority": str(certs / "apiserver.crt")},
            }
        ],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "node", "context": {"cluster": "node", "user": "user"}}],
        "current-context": "node",
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path


def pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_key_pair(prefix: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = prefix.with_suffix(".key"), prefix.with_suffix(".pub")
    private.write_bytes(pem_key(key))
    private.chmod(0o600)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, spki))
    return private, public


def write_kubelet_client(folder: Path) -> tuple[Path, Path, Path]:
    """A CA the kubelet trusts for client certificates, and the apiserver's client certificate from it
    (system:masters), so `kubectl logs`/`exec` reach the kubelet authenticated."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pon-node-kubelet-client-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
        x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client"),
    ])  # fmt: skip
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2)).sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = folder / "kubelet-ca.crt", folder / "kubelet-client.crt", folder / "kubelet-client.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(pem_key(key))
    paths[2].chmod(0o600)
    return paths


def containerd_toml(workdir: Path, pause_image: str) -> str:
    c = workdir / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{c}/root"
state = "{c}/state"
[grpc]
  address = "{c}/containerd.sock"
[ttrpc]
  address = "{c}/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{c}/opt"
[{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_hugetlb_controller = true
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{workdir}/cni/net.d"
"""


def cni_conflist(workdir: Path) -> dict[str, object]:
    gateway = str(next(ipaddress.ip_network(POD_CIDR).hosts()))
    return {
        "cniVersion": "1.0.0",
        "name": "pon-pods",
        "plugins": [
            {
                "type": "bridge", "bridge": "ponbr0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(workdir / "cni/ipam"),
                         "ranges": [[{"subnet": POD_CIDR, "gateway": gateway}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }  # fmt: skip


def kubelet_config(files: NodeFiles) -> dict[str, object]:
    endpoint = f"unix://{files.containerd_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_PARENT}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "oomScoreAdj": 0,
        "makeIPTablesUtilChains": False,
        "clusterDNS": [DNS_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "podLogsDir": str(files.workdir / "pod-logs"),
        "serializeImagePulls": False,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(files.kubelet_ca)}},
        "authorization": {"mode": "Webhook"},
    }  # fmt: skip


def kube_proxy_config(files: NodeFiles) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(files.kubeconfigs["system:kube-proxy"])},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # 0 everywhere: kube-proxy leaves the conntrack sysctls alone (several are host-wide)
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(files: NodeFiles) -> str:
    """cluster.local from the apiserver; every other name NXDOMAIN (the node forwards nothing outside)."""
    return f"""cluster.local:53 in-addr.arpa:53 {{
    bind {DNS_IP}
    errors
    kubernetes cluster.local in-addr.arpa {{
        kubeconfig {files.kubeconfigs["pon:coredns"]} node
    }}
    cache 5
}}
.:53 {{
    bind {DNS_IP}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
