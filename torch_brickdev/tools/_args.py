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


def fraction(text: str) -> float:
    """argparse type of a relative change (``--threshold 0.1`` for 10 %): a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 such as 0.1 (10 %), got "
                                         f"{text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0 such as 0.1 (10 %), "
                                         f"got {text}")
    return value
