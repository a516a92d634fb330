import sys

from plugin.podenv.cli import main

sys.exit(main())
