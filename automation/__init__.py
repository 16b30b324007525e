"""proxy-operator: automation."""
