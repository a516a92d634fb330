"""The pod's NCCL settings resolver: `python -m plugin.podenv`."""
