"""``python -m conveyor`` runs the command line, like the ``conveyor`` script."""

from .cli import main

main()
