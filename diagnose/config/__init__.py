"""Training configs: reading them, their layout, the memory model, what fits, preflight rules, megatron-core checks."""
