"""The kubelet device plugin front end (API v1beta1): `python -m plugin.deviceplugin`."""
