import faulthandler
import sys

from common.terminal import exit_on_signals

# a crash in native code (grpc's core) says where each thread was, not only -11
faulthandler.enable()

exit_on_signals("rdma-device-plugin", "before serving")  # the import below takes a while

from plugin.deviceplugin.cli import main  # noqa: E402

sys.exit(main())
