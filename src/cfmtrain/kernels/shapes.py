"""The kernel shapes the tests and the GPU check run the paper's two kernels on: conv shapes of
node irreps and edge harmonics, symmetric-contraction shapes that cover the kernels' paths."""

from __future__ import annotations

# (node irreps, lmax of the edge harmonics)
CONV_SHAPES = [("8x0e", 3), ("4x0e+4x1o", 3), ("3x0e+3x1o+3x2e", 2), ("2x0e+2x1o+2x1e+2x2e", 3)]
# (lmax of the input, correlation, output irreps, elements, channels, use_reduced_cg); channel
# counts cover the CPU kernel's paths: vector blocks (8/4/1 vectors) and a scalar tail
SC_SHAPES = [
    (1, 1, "0e", 1, 3, False),
    (1, 2, "0e+1o", 3, 4, True),
    (2, 3, "0e+1o+2e", 10, 16, False),
    (2, 3, "0e+1o+2e", 10, 5, True),
    (3, 3, "0e+1o", 2, 8, False),
    (3, 3, "0e+1o", 2, 9, True),
    (3, 2, "0e", 4, 70, True),
    (3, 1, "0e+1o", 1, 2, False),
]
