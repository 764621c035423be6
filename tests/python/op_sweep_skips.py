"""Known brick failures and harness adjustments for the op sweep (test_op_sweep.py).

Keys are OpInfo ids (``name`` or ``name.variant``), or ``id:dtype`` for the dtype sweep only.
Every entry carries a one-line reason.
"""

# Not run at all.
SKIPS = {}

# Run, expected to fail (strict=False); the reason is the failure's category.
XFAILS = {}

# Positional arguments (indices into sample.args) the op requires on the CPU, as on CUDA.
CPU_ARGS = {
    "tensor_split": (0,),  # tensor_indices_or_sections must be a CPU tensor
}

# Forward compared, backward not.
NO_BACKWARD = {}

# assert_close tolerances, where brick legitimately runs another (decomposed) kernel.
TOLERANCES = {}
