"""Known brick failures in the op sweep (test_op_sweep.py).

Keys are OpInfo ids (``name`` or ``name.variant``), or ``id:dtype`` for the dtype sweep only.
"""

# Not run at all: the reason says why.
SKIPS = {}

# Run, expected to fail (strict=False): the reason is the failure's category.
XFAILS = {}
