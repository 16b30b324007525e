"""The in-cluster half: the Kubernetes API client, leader election, status and events, credentials Secrets."""
