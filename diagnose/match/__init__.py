"""Matching signatures against lines: the engine interface and its engines (pure Python, Hyperscan)."""
