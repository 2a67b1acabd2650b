"""``python -m minidl.bench [main|conv|layers|sweep] ...``: see ``minidl/bench/__init__.py``."""
import sys

from minidl.bench.cli import main

sys.exit(main())
