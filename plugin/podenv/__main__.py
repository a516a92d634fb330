import sys

from common.terminal import exit_on_signals

exit_on_signals("lingjun-rdma podenv")

from plugin.podenv.cli import main  # noqa: E402

sys.exit(main())
