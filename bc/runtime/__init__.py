"""What every bc process uses whatever its role: logs, files written atomically, asyncio helpers, the version,
where the data dir is."""
