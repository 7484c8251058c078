"""CustomResourceDefinitions of kopf's peering objects, which elect one active operator replica.

kopf (the operator framework) keeps its peers in the `status` of a `KopfPeering` (namespaced operators)
or `ClusterKopfPeering` (cluster-wide operators) object of group `kopf.dev`; each replica patches its own
entry there with a priority and a lifetime, and every replica but the highest-priority one pauses.
"""

from __future__ import annotations

from typing import Any

PEERING_GROUP = "kopf.dev"
PEERING_VERSION = "v1"
PEERING_API_VERSION = f"{PEERING_GROUP}/{PEERING_VERSION}"
CLUSTER_PEERING_KIND = "ClusterKopfPeering"
NAMESPACED_PEERING_KIND = "KopfPeering"

# kopf writes `status.<identity> = {priority, lifetime, lastseen}`: free-form, so preserve unknown fields.
_PEERING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


def peering_crd(kind: str, namespaced: bool) -> dict[str, Any]:
    """A CRD for one of kopf's two peering kinds."""
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{PEERING_GROUP}"},
        "spec": {
            "group": PEERING_GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": PEERING_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _PEERING_SCHEMA},
                    "additionalPrinterColumns": [
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                    ],
                }
            ],
        },
    }


def peering_crds() -> dict[str, dict[str, Any]]:
    """File name to CRD for both peering kinds."""
    crds = (
        peering_crd(CLUSTER_PEERING_KIND, namespaced=False),
        peering_crd(NAMESPACED_PEERING_KIND, namespaced=True),
    )
    return {f"{crd['metadata']['name']}.yaml": crd for crd in crds}
