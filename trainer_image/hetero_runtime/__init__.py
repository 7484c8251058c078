"""heterotrain worker runtime: heterogeneity-aware training strategies on torch.distributed."""
