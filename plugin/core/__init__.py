"""What both front ends need: discovery, node state and health, pools, event sources,
metrics, the files and terminal a user hands us. Nothing kubelet-shaped."""
