"""proxy-operator: stacks."""
