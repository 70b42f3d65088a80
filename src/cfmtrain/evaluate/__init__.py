"""`cfmtrain evaluate`: a trained model's errors on a graph store's split or on extxyz frames,
per config_type and overall, with its parity plot and learning curves."""
