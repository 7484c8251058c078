"""Between epochs: read what the workers measured, refit their models, and decide the next plan."""
