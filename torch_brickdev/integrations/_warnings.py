"""The one wording of brick's warning when a library puts work on another device than brick."""

import warnings

__all__ = ["ACCELERATE_RECIPE", "warn_not_on_brick"]

# How to put accelerate, and the transformers Trainer that builds on it, on brick.
ACCELERATE_RECIPE = ("set ACCELERATE_TORCH_DEVICE=brick before the Accelerator, PartialState or "
                     "TrainingArguments are made (under torchrun too)")


def warn_not_on_brick(what: str, library: str, recipe: str, stacklevel: int = 1) -> None:
    """Warns that ``what`` happened (a choice of device other than brick) because ``library``
    does not know the brick device, and how to run on brick instead. ``stacklevel`` counts from
    the caller, as ``warnings.warn``'s does; Python's default filter shows it once per place."""
    warnings.warn(f"{what}, because {library} does not know the brick device. To run on brick, "
                  f"{recipe}.", UserWarning, stacklevel=stacklevel + 1)
