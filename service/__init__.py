"""proxy-operator: service."""
