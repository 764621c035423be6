"""Text from others (brick names, argv, file contents) as a terminal may show it.

Names and arguments in reports and live snapshots come from other people's programs and files.
Printed raw, an escape sequence in one could move the cursor, rewrite earlier lines or change the
terminal's title, and a bidirectional control could reorder what a reader sees. Every tool prints
such text through ``printable``: control and bidi characters become visible escapes, and a long
text is cut with its length stated. Plain Python (no torch).
"""

import shutil
import unicodedata

__all__ = ["printable", "terminal_columns"]

# Unicode's explicit directional formatting characters (format category Cf, but listed so the
# intent is plain): embeddings, overrides, isolates and the marks.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _shown(char: str) -> str:
    if char in _BIDI_CONTROLS:
        return _escape(char)
    # Cc: C0/C1 controls (ESC, CSI, newline, tab...); Cf: other invisible format characters;
    # Cs: lone surrogates (from surrogateescape'd bytes); Co/Cn: private and unassigned.
    if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
        return _escape(char)
    return char


def printable(text, limit: int = 0) -> str:
    """``text`` (any object: ``str()`` of it) with every control, format and bidi character
    escaped (``\\x1b``, ``\\u202e``), so that it prints as the characters it holds. With
    ``limit`` > 0, a longer result is cut to about ``limit`` characters, saying how long it was."""
    text = text if isinstance(text, str) else str(text)
    if limit > 0 and len(text) > limit:
        shown = "".join(_shown(c) for c in text[:limit])
        return f"{shown}... ({len(text)} characters)"
    if text.isprintable():  # the common case, checked in C: nothing to escape
        return text
    return "".join(_shown(c) for c in text)


def terminal_columns(default: int = 100) -> int:
    """The terminal's width in columns (``COLUMNS`` first, as ``shutil`` reads it), or
    ``default`` where the output is not a terminal."""
    return shutil.get_terminal_size((default, 24)).columns
