"""The end-to-end demonstration: a real job on the local test bed that rebalances as it trains."""
