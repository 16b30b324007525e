# proxy-operator's image: the service, its Pulumi program and virtual environment, and the Pulumi tools.
#
#   docker build -t proxy-operator:0.1.0 .                        # the official Pulumi releases are downloaded
#   docker build --build-arg PLUGINS="kubernetes gcp" .   # the plugins your catalogue uses (kvm needs none)
#
# Without a registry or get.pulumi.com (as on this project's build machines) `make image` builds it from the
# same file: a base made from Debian's packages (BASE_IMAGE) and the CLI and plugins from .tools/bin given as
# the build context `pulumi-tools`, which replaces the download stage (scripts/build-image.sh; figures in
# docs/operations.md, "Install in a cluster").
#
# The tools live in /opt/proxy-operator/bin (on PATH), never in PULUMI_HOME: in a pod PULUMI_HOME is an
# emptyDir, and a plugin downloaded there would be lost with the pod (and cannot be downloaded at all where
# get.pulumi.com is out of reach). The engine puts the CLI's folder first on PATH, where the CLI finds plugins.
# Read-only root works: everything written goes to /var/lib/proxy-operator and /tmp (emptyDirs in deploy/).
#
# BASE_IMAGE must give `python3.11` with venv; the same base builds the virtual environment and runs it.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

# --- the Pulumi CLI and provider plugins: the official releases of the versions the SDKs pin ----------------
# Keep these equal to requirements.lock (pulumi, pulumi_kubernetes, pulumi_gcp);
# tests/test_dockerfile.py checks it.
FROM ${BASE_IMAGE} AS pulumi-tools
ARG PULUMI_VERSION=3.260.0
ARG PULUMI_KUBERNETES_VERSION=4.25.0
ARG PULUMI_GCP_VERSION=10.2.0
# Provider plugins to bake in, by Pulumi package name: the types your catalogue uses (kvm needs none: its
# resources are dynamic providers on libvirt-python, stacks/programs/libvirt_*.py).
ARG PLUGINS="kubernetes"
ARG TARGETARCH
# Only `pulumi` from the CLI bundle: the language host and the dynamic-provider launcher are the package's own
# console scripts (automation/engine/langhost.py, automation/dynamic_provider.py).
COPY scripts/fetch-pulumi-tools.py /fetch-pulumi-tools.py
RUN python3.11 /fetch-pulumi-tools.py /out

# --- the virtual environment: locked dependencies, then the package itself (not editable) -------------------
FROM ${BASE_IMAGE} AS venv
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.11 -m venv /opt/proxy-operator/venv
WORKDIR /src
# Dependencies first, from pyproject.toml at the versions of requirements.lock (which also pins the test
# tools: they stay out), so that a change to the source alone reuses this layer.
COPY pyproject.toml requirements.lock ./
# pip's cache is a build cache mount: a changed lock downloads only what changed. The optional secret
# `pip-cert` is a CA bundle for an index behind a TLS-intercepting proxy (`--secret id=pip-cert,src=FILE`);
# it is not left in the image.
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip-cert \
    if [ -f /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
 && python3.11 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' > dependencies.txt \
 && /opt/proxy-operator/venv/bin/pip install -q -c requirements.lock -r dependencies.txt
COPY README.md ./
COPY stacks stacks
COPY automation automation
COPY service service
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip-cert \
    if [ -f /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
 && /opt/proxy-operator/venv/bin/pip install -q --no-deps . \
 && /opt/proxy-operator/venv/bin/pip check \
 && /opt/proxy-operator/venv/bin/pip uninstall -q -y pip

# --- the image ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="proxy-operator" \
      org.opencontainers.image.description="Proxy objects in, one Pulumi stack per provider, a discovery API out." \
      org.opencontainers.image.licenses="Apache-2.0"
# ssh: the kvm program delivers proxy credentials to the KVM host over SSH (stacks/programs/kvm_credentials.py).
RUN command -v ssh >/dev/null || (apt-get update -qq \
      && apt-get install -y -qq --no-install-recommends openssh-client && rm -rf /var/lib/apt/lists/*)
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/proxy-operator \
      --shell /usr/sbin/nologin proxy-operator \
 && install -d -o 10001 -g 10001 /var/lib/proxy-operator
COPY --from=venv /opt/proxy-operator/venv /opt/proxy-operator/venv
COPY --from=pulumi-tools /out/ /opt/proxy-operator/bin/
# The package's Pulumi plugins beside the CLI: one folder holds every tool the engine runs.
RUN ln -s ../venv/bin/pulumi-language-python ../venv/bin/pulumi-resource-pulumi-python /opt/proxy-operator/bin/ \
 && /opt/proxy-operator/bin/pulumi version
ENV PATH=/opt/proxy-operator/bin:/opt/proxy-operator/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/var/lib/proxy-operator \
    PULUMI_HOME=/var/lib/proxy-operator/pulumi-home \
    PULUMI_SKIP_UPDATE_CHECK=true \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PROXY_OPERATOR_STATE_DIR=/var/lib/proxy-operator \
    PROXY_OPERATOR_LISTEN_HOST=0.0.0.0
USER 10001:10001
WORKDIR /var/lib/proxy-operator
EXPOSE 8080
ENTRYPOINT ["proxy-operator"]
CMD ["serve"]
