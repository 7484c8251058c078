"""HeteroTrainJob as a Kueue workload: pure builders and readers of Kueue's v1beta2 objects.

The operator owns one `Workload` per job labelled `kueue.x-k8s.io/queue-name`, with one pod set per
GPU class of the mix it proposes; Kueue admits the pod sets on ResourceFlavors, and the operator
places the workers on what was admitted. Nothing here talks to the API server.
"""
