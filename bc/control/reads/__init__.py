"""Every read the Admin API serves (queries), and the mappers from store rows to its messages (views)."""
