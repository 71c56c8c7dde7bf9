import sys

from ratchet.cli import main

sys.exit(main())
