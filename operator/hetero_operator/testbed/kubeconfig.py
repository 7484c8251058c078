"""Write the admin kubeconfig of the test bed, with every credential embedded."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from hetero_operator.testbed.certs import Pki

CONTEXT = "heterotrain-testbed"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def admin_kubeconfig(server: str, pki: Pki) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CONTEXT, "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)}}
        ],
        "users": [
            {
                "name": CONTEXT,
                "user": {
                    "client-certificate-data": _b64(pki.admin_cert),
                    "client-key-data": _b64(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT}}],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    path.write_text(yaml.safe_dump(admin_kubeconfig(server, pki), sort_keys=False))
    path.chmod(0o600)
    return path
