"""Fixes: what to fix, the computed fixes and their search, the plan, resume safety, writing the config."""
