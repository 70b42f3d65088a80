"""Analytic forward FLOP counts of the fused ops, derived from a model's own CG tensors, for the
GFLOP/s column of `cfmtrain bench kernels` (compared with a matmul peak measured in the same run).

What is counted (the forward pass only; backward passes are not counted, so GFLOP/s is reported
for forward rows alone), one multiply-add = 2 FLOPs:
  - conv (`conv_tp`, e3nn 'uvu' with per-edge weights, gathered from senders, summed into
    receivers), per edge: for each instruction, 2 x (non-zero Wigner 3j entries) x channels
    (x[i,u] * (C_ijk y[j]) accumulated into out[k,u]); + channels x dim(out irrep) for the
    per-edge radial weight w[u]; + dim(irreps_out) for the scatter-add into the receiver.
    The per-edge C_ijk y[j] products (independent of channels) are not counted.
  - symmetric contraction, per node: for each output irrep and correlation order nu,
    2 x (non-zero entries of mace's dense generalized CG tensor U_nu) x channels: each entry is
    one multiply-add of (U . W)[elem] with a monomial x[i1,u]...x[i_nu,u]. Building the
    monomials and contracting U with the weights (once per element per call) are not counted;
    nor is the symmetry of the monomials, so this is the dense-U sparse count the op requires.
"""

from __future__ import annotations

import torch
from e3nn import o3

# Entries below this fraction of a tensor's largest magnitude are cancellation residues.
ZERO_TOL = 1e-10


def count_nonzero(tensor: torch.Tensor) -> int:
    """Entries of `tensor` above ZERO_TOL times its largest magnitude."""
    magnitude = tensor.detach().double().abs()
    if magnitude.numel() == 0:
        return 0
    return int((magnitude > ZERO_TOL * float(magnitude.max())).sum())


def conv_forward_flops(tp: torch.nn.Module, num_edges: int) -> int:
    """Forward FLOPs of the fused conv of e3nn TensorProduct `tp` over `num_edges` edges."""
    per_edge = tp.irreps_out.dim  # the scatter-add of the message
    for ins in tp.instructions:
        mul, ir1 = tp.irreps_in1[ins.i_in1]
        ir2, ir_out = tp.irreps_in2[ins.i_in2].ir, tp.irreps_out[ins.i_out].ir
        nonzero = count_nonzero(o3.wigner_3j(ir1.l, ir2.l, ir_out.l, dtype=torch.float64))
        per_edge += 2 * nonzero * mul + mul * ir_out.dim
    return per_edge * int(num_edges)


def symmetric_contraction_forward_flops(sc: torch.nn.Module, num_nodes: int) -> int:
    """Forward FLOPs of mace SymmetricContraction `sc` (or its fused drop-in) on `num_nodes`."""
    from cfmtrain.kernels.symmetric_contraction import u_matrix_float64

    per_node = 0
    for contraction, mul_ir in zip(sc.contractions, sc.irreps_out, strict=True):
        for nu in range(1, contraction.correlation + 1):
            nonzero = count_nonzero(u_matrix_float64(contraction, mul_ir.ir, nu))
            per_node += 2 * nonzero * mul_ir.mul
    return per_node * int(num_nodes)
