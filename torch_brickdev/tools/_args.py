"""The command line's argument types (the tools' other argument checks are the library's public
``torch_brickdev.argcheck``)."""

import argparse


def positive_int(text: str) -> int:
    """argparse type of the command line's counts (``--layers 2``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value
