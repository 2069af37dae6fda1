"""``python -m corral_worker``: the console script."""

from .cli import main

raise SystemExit(main())
