import sys

from plugin.core.terminal import exit_on_signals

exit_on_signals("rdma-device-plugin", "before serving")  # the import below takes a while

from plugin.deviceplugin.cli import main  # noqa: E402

sys.exit(main())
