"""Reading logs: bytes to lines, line framing, and the structure parsers and block readers."""
