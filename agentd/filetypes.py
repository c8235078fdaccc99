"""A file's type from its bytes: what a sender declares is only a claim."""

from __future__ import annotations


def sniff(data: bytes, declared: str) -> str:
    """The file's type from its bytes; UTF-8 text without NULs is text; else unknown."""
    import filetype

    kind = filetype.guess(data)
    if kind is not None:
        return kind.mime
    if b"\x00" not in data:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return "application/octet-stream"
        declared = declared.split(";")[0].strip().lower()
        # Text claiming to be HTML or SVG is kept as plain text: nothing stored runs as markup.
        return declared if declared.startswith("text/") and declared != "text/html" else "text/plain"
    return "application/octet-stream"
