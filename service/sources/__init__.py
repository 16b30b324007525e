"""Sources of desired state: a folder of manifests (and, in a cluster, the Kubernetes API)."""
