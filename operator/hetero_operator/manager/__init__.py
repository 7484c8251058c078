"""The operator process: kopf's handlers and indexes, its settings, and the wiring of the scheduling
loop (`controller`) to the per-job tasks that measure running jobs (`rebalance`)."""
