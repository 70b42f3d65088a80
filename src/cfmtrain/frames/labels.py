"""MACE's label keys, declared once: where mace-torch's files (and the pipeline's extxyz frames)
keep each label. Everything else imports them from here.
"""

from __future__ import annotations

ENERGY_KEY = "REF_energy"  # info: eV
FORCES_KEY = "REF_forces"  # arrays: eV/A
STRESS_KEY = "REF_stress"  # info: 3x3 (or Voigt 6) eV/A^3, ASE's sign
VIRIALS_KEY = "REF_virials"  # info: eV (mace-torch's; own data may hold one instead of stress)
CONFIG_TYPE_KEY = "config_type"  # info: the subset a frame belongs to
CONFIG_WEIGHT_KEY = "config_weight"  # info: the frame's weight in the loss
# label -> its key, as readers and checks take them
KEYS: dict[str, str] = {"energy": ENERGY_KEY, "forces": FORCES_KEY, "stress": STRESS_KEY}
