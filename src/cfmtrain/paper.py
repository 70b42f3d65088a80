"""The paper's facts, declared once (Firoz et al., HPDC 2025): Table 3, the cutoff, the capacity,
its scale and reported timings, and the ablation's variants. Everything else imports them here.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Table3Row:
    """One data set of the paper's Table 3: our key, its name there, atoms per graph, graphs."""

    key: str
    name: str
    atoms: tuple[int, int]
    graphs: int


# in the order of the embedded `mini` set's subsets (its random streams follow this order)
TABLE3: tuple[Table3Row, ...] = (
    Table3Row("water_clusters", "Water clusters", (9, 75), 460_000),
    Table3Row("liquid_water", "Liquid water", (768, 768), 190_267),
    Table3Row("cuni", "CuNi", (492, 500), 74_335),
    Table3Row("hea", "HEA", (36, 48), 25_628),
    Table3Row("mptrj", "MPtrj", (1, 444), 1_580_312),
    Table3Row("tmd", "TMD", (16, 96), 219_627),
    Table3Row("zeolite", "Zeolite", (203, 408), 99_770),
    Table3Row("al_hcl", "Al-HCl(aq)", (281, 281), 884),
)
TABLE3_GRAPHS = sum(row.graphs for row in TABLE3)  # 2,650,823
PAPER_GRAPHS = 2_650_000  # "2.65M graphs", as the paper rounds its union
CUTOFF = 4.5  # Angstrom (section 5.2; 5.1.1 says 4)
CAPACITY = 3072  # atoms per Algorithm 1 bin
PAPER_RANKS = 740  # GPUs (a rank each) of the paper's largest run
# MACE-MP-0 "medium" (128x0e+128x1o, lmax 3, correlation 3, 2 layers, the paper's model shape):
# 4.69M parameters (its model card)
PAPER_PARAMETERS = 4_690_000
# weak scaling (section 5.4.2): (graphs, ranks), graphs per rank roughly constant
WEAK_SCALING: tuple[tuple[int, int], ...] = ((600_000, 16), (1_200_000, 32), (PAPER_GRAPHS, 64))


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant of the ablation: batched by Algorithm 1 (balanced) or a fixed graph count,
    trained with the fused kernels (fused) or mace-torch's modules; its figures' label and colour.
    `matched`: a fixed count matched to Algorithm 1's atoms per batch (ours, not the paper's)."""

    name: str
    balanced: bool
    fused: bool
    label: str
    colour: str
    matched: bool = False


BASELINE = Variant("baseline", False, False, "MACE (fixed count)", "tab:gray")
BALANCER = Variant("balancer", True, False, "MACE + load balancer", "tab:blue")
KERNEL = Variant("kernel", False, True, "MACE + fused kernels", "tab:orange")
BOTH = Variant("both", True, True, "MACE + balancer + kernels", "tab:green")
# ours, not the paper's: the fixed count that matches the balancer's mean atoms per batch
MATCHED = Variant("matched", False, False, "MACE (fixed count, matched atoms)", "tab:brown",
                  matched=True)
PAPER_VARIANTS = (BASELINE, BALANCER, KERNEL, BOTH)  # the paper's four, in its order
ALL_VARIANTS = (*PAPER_VARIANTS, MATCHED)
ABLATION = tuple(v.name for v in PAPER_VARIANTS)
VARIANTS = tuple(v.name for v in ALL_VARIANTS)
_BY_NAME = {v.name: v for v in ALL_VARIANTS}

# The paper's reported numbers (section 5.4 and the conclusion; never used to fit anything):
# minutes per epoch by (variant, ranks), both's speed-up over baseline at 740 ranks ("6x") and
# both's strong-scaling efficiency from 16 to 740 ranks (80 / (740/16 * 2)).
EPOCH_MINUTES = {(BASELINE.name, PAPER_RANKS): 12.0, (BOTH.name, PAPER_RANKS): 2.0,
                 (BASELINE.name, 64): 100.0, (BOTH.name, 64): 18.0, (BOTH.name, 16): 80.0}
SPEEDUP = 6.0
STRONG_EFFICIENCY = 0.865


def variant(name: str) -> Variant:
    """The variant called `name`; an unknown name is a ValueError listing the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}") from None
