"""What both halves (infra/ and plugin/) use and nothing of either: bounded file reads and
atomic writes, the terminal (say, log, signals), the secret mask."""
