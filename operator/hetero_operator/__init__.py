"""heterotrain operator: places training jobs on heterogeneous GPU pools and rebalances them.

Kept free of heavy imports so that the runtime can use the pure parts (planner, plan schema,
metric names) without pulling in kopf or the Kubernetes client.
"""

__version__ = "0.1.0"
