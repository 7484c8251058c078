"""The API's own request metrics, registered on the registry /metrics serves."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from hetero_operator import metric_names as names

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            names.API_REQUESTS,
            "Requests to the operator's HTTP API.",
            [names.LABEL_ROUTE, names.LABEL_METHOD, names.LABEL_CODE],
            registry=registry,
        )
        self.seconds = Histogram(
            names.API_REQUEST_SECONDS,
            "Time to answer one API request.",
            [names.LABEL_ROUTE, names.LABEL_METHOD],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def observe(self, route: str, method: str, code: int, seconds: float) -> None:
        self.requests.labels(route, method, str(code)).inc()
        self.seconds.labels(route, method).observe(seconds)
