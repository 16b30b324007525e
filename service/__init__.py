"""proxy-operator: service."""

from service.lean_packages import defer_service_packages

# Before any module of the service imports `kubernetes`: its package __init__s (every feature of the
# client, the kubeconfig loader with requests and oauthlib) run only when a name only they define is asked
# for (service/lean_packages.py).
defer_service_packages()
