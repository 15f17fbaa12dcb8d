"""Optional layers of the workflows app (metrics)."""
