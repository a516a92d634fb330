import sys

from plugin.core.terminal import exit_on_signals

exit_on_signals("rdma-dra-driver", "before serving")  # the import below takes a while

from plugin.dra.cli import main  # noqa: E402

sys.exit(main())
