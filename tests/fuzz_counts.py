"""What a property-based test really ran: hypothesis may stop early or filter inputs, so each
fuzz property counts its examples and checks it ran at least 90 % of what it asked for."""
from __future__ import annotations


class Counts(dict):
    def count(self, name: str) -> None:
        self[name] = self.get(name, 0) + 1

    def report(self, name: str, wanted: int) -> None:
        n = self.get(name, 0)
        print(f"fuzz {name}: {n} examples")
        assert n >= 0.9 * wanted, f"{name}: only {n} of {wanted} examples ran"
