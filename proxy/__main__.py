"""``python -m proxy`` is the same as the ``tunnelgate`` command."""

from proxy.control.cli import main

raise SystemExit(main())
