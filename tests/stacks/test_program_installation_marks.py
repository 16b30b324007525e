"""Every program marks its resources with this installation's id (the stack config
`proxy-operator:installation`, in `ProgramSettings.installation`), so `proxy-operator orphans` can tell
this installation's leftovers from another's.

Mocked with `pulumi.runtime.set_mocks` (fresh mocks per test, the program run under `pulumi.runtime.test`
by the harness): the kubernetes, gcp and libvirt plugins cannot run here. The assertions are on the inputs
each resource was registered with.
"""

from __future__ import annotations

import pytest

from stacks.marks import carries_installation
from stacks.models import GcpProvider, KubernetesProvider, KvmProvider
from stacks.programs.context import ProgramSettings
from tests.stacks.program_harness import RecordingMocks, install, proxy, run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_gcp")

INSTALLATION = "Install-7f3a 01"  # squeezed into each kind's label value
KVM_DOMAIN = "pulumi-python:dynamic/proxy-operator:LibvirtDomain"
K8S_KINDS = (
    "kubernetes:core/v1:Secret",
    "kubernetes:apps/v1:Deployment",
    "kubernetes:core/v1:Service",
    "kubernetes:networking.k8s.io/v1:NetworkPolicy",
)


def _settings(stack: str, installation: str | None = INSTALLATION) -> ProgramSettings:
    return ProgramSettings(stack=stack, root_dir="/tmp", installation=installation)


def test_kubernetes_objects_carry_the_installation_but_the_pod_template_does_not() -> None:
    mocks = RecordingMocks()
    install(mocks, stack="in-cluster")
    entry = KubernetesProvider(name="in-cluster", type="kubernetes", namespace="proxies")
    spec = {"provider": "in-cluster", "allowedSourceRanges": ["10.0.0.0/8"]}
    run(entry=entry, proxies=[proxy("a", **spec)], settings=_settings("in-cluster"))

    for kind in K8S_KINDS:
        labels = mocks.one(kind).inputs["metadata"]["labels"]
        assert labels["crawl.example.com/installation"] == "Install-7f3a_01", kind
        assert labels["app.kubernetes.io/managed-by"] == "proxy-operator"
    deployment = mocks.one("kubernetes:apps/v1:Deployment").inputs["spec"]
    # On the pod template (or the selector) it would roll every pod once when it is added.
    assert "crawl.example.com/installation" not in deployment["template"]["metadata"]["labels"]
    assert "crawl.example.com/installation" not in deployment["selector"]["matchLabels"]


def test_kubernetes_without_an_installation_id_adds_no_label() -> None:
    mocks = RecordingMocks()
    install(mocks, stack="in-cluster")
    entry = KubernetesProvider(name="in-cluster", type="kubernetes", namespace="proxies")
    run(entry=entry, proxies=[proxy("a", provider="in-cluster")], settings=_settings("in-cluster", None))

    labels = mocks.one("kubernetes:apps/v1:Deployment").inputs["metadata"]["labels"]
    assert "crawl.example.com/installation" not in labels


def test_gcp_instance_address_and_secret_are_labelled_and_firewalls_described() -> None:
    mocks = RecordingMocks(
        computed={
            "gcp:compute/instance:Instance": _nat,
            "gcp:compute/address:Address": lambda _: {"address": "198.51.100.7"},
            "gcp:serviceaccount/account:Account": lambda o: {"email": f"{o['accountId']}@p.iam"},
            "gcp:secretmanager/secretVersion:SecretVersion": lambda _: {"name": "projects/1/secrets/s/v/1"},
        }
    )
    install(mocks, stack="gcp-eu")
    entry = GcpProvider(
        name="gcp-eu", type="gcp", project="crawl-proj", region="europe-west1", zone="europe-west1-b"
    )
    spec = {"provider": "gcp-eu", "allowedSourceRanges": ["203.0.113.0/24"], "gcp": {"addressType": "static"}}
    run(entry=entry, proxies=[proxy("a", **spec)], settings=_settings("gcp-eu"))

    instance = mocks.one("gcp:compute/instance:Instance").inputs
    for labels in (
        instance["labels"],
        mocks.one("gcp:compute/address:Address").inputs["labels"],
        mocks.one("gcp:secretmanager/secret:Secret").inputs["labels"],
    ):
        assert labels["installation"] == "install-7f3a_01"  # GCP: lowercase, [-_a-z0-9]
        assert labels["managed-by"] == "proxy-operator"
    # A boot disk's labels are fixed at creation: adding one there would replace the VM.
    assert "installation" not in instance["bootDisk"]["initializeParams"]["labels"]
    [firewall] = mocks.of_type("gcp:compute/firewall:Firewall")
    assert carries_installation(firewall.inputs["description"], INSTALLATION)
    assert not carries_installation(firewall.inputs["description"], "another-installation")


def test_kvm_domain_description_carries_the_installation() -> None:
    mocks = RecordingMocks(computed={KVM_DOMAIN: lambda _: {"address": "192.168.122.50"}})
    install(mocks, stack="kvm-home")
    entry = KvmProvider.model_validate(
        {"name": "kvm-home", "type": "kvm", "hosts": [{"name": "hv1", "uri": "qemu+ssh://virt@hv1/system"}]}
    )
    run(entry=entry, proxies=[proxy("a", provider="kvm-home")], settings=_settings("kvm-home"))

    description = mocks.one(KVM_DOMAIN).inputs["description"]
    assert description == (
        "managed-by=proxy-operator proxy=crawl/a stack=kvm-home installation=Install-7f3a_01"
    )
    assert carries_installation(description, INSTALLATION)


def _nat(outputs: dict[str, object]) -> dict[str, object]:
    nics = outputs["networkInterfaces"]
    assert isinstance(nics, list)
    nics[0]["accessConfigs"][0]["natIp"] = nics[0]["accessConfigs"][0].get("natIp") or "203.0.113.50"
    return {"networkInterfaces": nics}
