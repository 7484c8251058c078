"""Pinned versions of every test-bed component and the cache directory they are built into."""

from __future__ import annotations

import os
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.21.4"
# Prometheus 3.9.1 (its Go module tags it v0.309.1), pinned in testbed/prometheus/go.mod. Built from
# source because the distribution package leaves out Kubernetes service discovery.
PROMETHEUS_VERSION = "3.9.1"
# Kueue, pinned in testbed/kueue/go.mod (with Kueue's own go.sum: the module proxy serves this release
# but not its version list). KUEUE_COMMIT is the release tag's commit, stamped into the binary.
KUEUE_VERSION = "v0.19.2"
KUEUE_COMMIT = "8eab68778fc1b52affe165fdf5af29d1e9b4f3cb"

# Bump when the way binaries are built changes, so stale caches are not reused.
BUILD_RECIPE = 1

REPO_ROOT = Path(__file__).resolve().parents[3]
GO_MODULES = REPO_ROOT / "testbed"


def cache_root() -> Path:
    """Where built binaries live; kept between runs and between clones of the repository."""
    base = os.environ.get("HETEROTRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "heterotrain"
    )
    return Path(base)


def build_root() -> Path:
    return cache_root() / f"testbed-build-{BUILD_RECIPE}"
