"""`python -m envforge.cli` is the `envforge` command."""

from .main import main

main()
