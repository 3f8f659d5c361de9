import sys

from surgeon.cli.commands import main

sys.exit(main())
