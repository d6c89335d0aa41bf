import sys

from mi_core.cli import main

sys.exit(main())
