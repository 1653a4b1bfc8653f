"""``python -m harness.cli``: the ``latroute`` command without its console script
(subprocess tests and ``latroute bench`` start it this way)."""

from harness.cli import main

main()
