"""The node's half of tunnels (docs/access.md): exec tickets checked here, bytes carried over the session's channel."""
