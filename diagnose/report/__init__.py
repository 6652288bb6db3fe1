"""Output formats, registered in one place: name -> Formatter class."""
from __future__ import annotations

from .base import Formatter
from .github import GithubFormatter
from .gitlab import GitlabFormatter
from .json import JsonFormatter
from .junit import JunitFormatter
from .markdown import MarkdownFormatter
from .sarif import SarifFormatter
from .text import TextFormatter

FORMATS: dict[str, type[Formatter]] = {
    "text": TextFormatter,
    "json": JsonFormatter,
    "sarif": SarifFormatter,
    "junit": JunitFormatter,
    "github": GithubFormatter,
    "gitlab": GitlabFormatter,
    "markdown": MarkdownFormatter,
}


def get_formatter(name: str, **options) -> Formatter:
    return FORMATS[name](**options)
