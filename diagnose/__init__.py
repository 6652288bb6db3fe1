"""diagnose: failure diagnostics and auto-remediation for Megatron-Core / Megatron-Bridge training jobs."""

__version__ = "0.1.0"
