"""Self-update: the A/B swap (swap_rules, pure), the slots on disk, the download, the controller."""
