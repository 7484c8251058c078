"""PromQL over the exported metric names. Each function returns one expression; nothing here knows
about Grafana beyond the `$__rate_interval` and variable placeholders it leaves in."""

from __future__ import annotations

from hetero_operator import metric_names as names

RATE_WINDOW = "$__rate_interval"


def selector(metric: str, matchers: str = "") -> str:
    return f"{metric}{{{matchers}}}" if matchers else metric


def by(labels: tuple[str, ...]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def summed(metric: str, labels: tuple[str, ...] = (), matchers: str = "") -> str:
    """A gauge summed per label set."""
    return f"sum{by(labels)} ({selector(metric, matchers)})"


def per_second(counter: str, labels: tuple[str, ...] = (), matchers: str = "") -> str:
    """Rate of a counter (its exported `_total` series) summed per label set."""
    return f"sum{by(labels)} (rate({selector(names.total(counter), matchers)}[{RATE_WINDOW}]))"


def histogram_mean(histogram: str, labels: tuple[str, ...] = (), matchers: str = "") -> str:
    """Mean observation over the window: rate of the sum over rate of the count."""
    total = per_second_raw(names.histogram_sum(histogram), labels, matchers)
    count = per_second_raw(names.histogram_count(histogram), labels, matchers)
    return f"{total} / {count}"


def histogram_quantile(
    quantile: float, histogram: str, labels: tuple[str, ...] = (), matchers: str = ""
) -> str:
    """A quantile of a histogram over the window, per label set."""
    buckets = per_second_raw(f"{histogram}_bucket", ("le", *labels), matchers)
    return f"histogram_quantile({quantile}, {buckets})"


def per_second_raw(series: str, labels: tuple[str, ...] = (), matchers: str = "") -> str:
    """Rate of an exported series named exactly `series`, summed per label set."""
    return f"sum{by(labels)} (rate({selector(series, matchers)}[{RATE_WINDOW}]))"


def changes_over(metric: str, window: str, labels: tuple[str, ...] = (), matchers: str = "") -> str:
    """How often a gauge changed value within `window`, per label set (max over the other labels)."""
    return f"max{by(labels)} (changes({selector(metric, matchers)}[{window}]))"
