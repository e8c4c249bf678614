"""`python -m benches` (`make bench`)."""

from benches.cli import main

main()
