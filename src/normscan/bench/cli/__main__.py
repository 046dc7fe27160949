"""``python -m normscan.bench.cli``: the ``normscan`` command, from a source tree without installing."""
import sys

from . import main

sys.exit(main())
