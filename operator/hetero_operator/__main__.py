"""`python -m hetero_operator` runs the heterotrain command line."""

from hetero_operator.cli import main

main()
