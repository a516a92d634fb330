import sys

try:
    from plugin.deviceplugin.cli import main

    sys.exit(main())
except KeyboardInterrupt:  # before the CLI's own handling: while Python imports it
    print("rdma-device-plugin: interrupted before serving", file=sys.stderr)
    sys.exit(130)
