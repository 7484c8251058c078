"""What ships the operator: the Helm chart's generated templates."""
