"""The command queue: enqueue, the state table, runs of many, the gateway's dispatch pass, the sweeper."""
