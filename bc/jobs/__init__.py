"""The DAG job queue (ARCHITECTURE.md §8, docs/jobs.md).

`model` is the shape of a job (a DAG of primitive nodes, its edges, the one
node state table, the roll-up); `scheduler` is the pure step function that
decides which nodes run, which are cancelled and which resources move. Both
are pure: no I/O, no clock, no asyncio. Persistence, the primitives'
executors, the Admin API, the CLI and the templates are built on top of them.
"""
