"""The operator's HTTP API (FastAPI): pools, jobs and what-if placement behind Kubernetes auth.

`create_app(settings)` builds the ASGI app; `serve(app, host, port)` runs it inside an existing
asyncio loop, `serve_until_signalled` alone until SIGINT or SIGTERM. It reads the cluster through its
own read-only client, never the operator's memory.
"""

from hetero_operator.api.app import create_app
from hetero_operator.api.server import ApiStartError, serve, serve_until_signalled
from hetero_operator.api.settings import ApiSettings

__all__ = ["ApiSettings", "ApiStartError", "create_app", "serve", "serve_until_signalled"]
