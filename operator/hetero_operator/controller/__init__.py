"""The kopf operator: thin handlers around pure decisions.

`handlers` registers the kopf handlers and indexes, `inventory` turns the indexes into an immutable
view, `lifecycle` and `launcher` are pure, `scheduling_loop` runs one debounced cycle at a time and
is the only writer of job status after validation, `k8s` is the small async API client.
"""
