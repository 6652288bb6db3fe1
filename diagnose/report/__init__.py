"""Output formats, registered in one place: name -> Formatter class."""
from __future__ import annotations

from .base import Formatter
from .json import JsonFormatter
from .text import TextFormatter

FORMATS: dict[str, type[Formatter]] = {
    "text": TextFormatter,
    "json": JsonFormatter,
}


def get_formatter(name: str, **options) -> Formatter:
    return FORMATS[name](**options)
