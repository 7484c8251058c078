"""The local test bed: a real Kubernetes control plane, KWOK GPU nodes and Prometheus on loopback."""
