"""The /metrics exposition, port counters and queue pairs per pod."""
