"""`python -m specbench.bench` (`make bench`)."""

from specbench.bench.cli import main

main()
