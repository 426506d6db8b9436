"""The policy engine: rules, targets, the address guard and the verdict (pure)."""
