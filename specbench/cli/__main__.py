"""`python -m specbench.cli ...`: the same command line as `specbench ...`."""

from specbench.cli import main

main()
