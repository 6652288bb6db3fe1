"""The Formatter interface: one module per output format, registered in report/__init__.py."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..model import Report


class Formatter(ABC):
    name = "abstract"
    #: machine formats go to stdout only; the human summary goes to stderr beside them
    machine = True

    def __init__(self, fail_on: str = "error", **options):
        self.fail_on = fail_on
        self.options = options

    @abstractmethod
    def render(self, report: Report) -> str:
        """The whole report as text."""
