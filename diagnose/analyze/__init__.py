"""Findings to one root cause: the evidence layers, the metric symptoms, expected vs observed cost."""
