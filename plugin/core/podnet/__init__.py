"""A pod's own GID and NCCL settings: GID choice, a namespace's addresses."""
