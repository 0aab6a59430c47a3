"""`bc doctor` on a server's data dir, and this process's clock against the store's."""
