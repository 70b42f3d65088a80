"""The settings of `cfmtrain bench scale` (config section `scale`): types, defaults and help,
declared once; the command's flags and the workflow config's defaults follow from them."""

from __future__ import annotations

import dataclasses

from cfmtrain.settings import setting

SHARD_GRAPHS = 20_000  # frames per shard: jobs of ~20 s each (memory is bounded at any size)


@dataclasses.dataclass
class ScaleSettings:
    """The counts, the timed training and how the data is built."""

    graphs: list[int] = setting([10_000, 100_000], "graph counts (the paper's scale: 1000000)")
    steps: int = setting(50, "training steps timed at each count")
    ranks: int = setting(2, "training ranks")
    workers: int = setting(2, "parallel generate and graphs processes")
    shard_graphs: int = setting(SHARD_GRAPHS, "frames per shard")
    open_rounds: int = setting(7, "paired rounds of opening every count's store")
    scaling_rounds: int = setting(3, "paired rounds of graph building in 1 against 2 processes, "
                                  "on the smallest count's first shard (0: not measured)")
