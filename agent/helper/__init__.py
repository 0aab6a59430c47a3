"""`bc helper`: the only root code on a node, and the agent's client of it.

The unprivileged `bc node` asks the root `bc helper` for typed operations
over a unix socket. `ops` is the table and its validation (pure: a request
in, a plan of effects out, or `Refused`); `wire` the framing; `effects`
carries a plan out as root; `server` the socket (SO_PEERCRED on every
connection); `client` the agent's side. docs/node-security.md has the table.
"""
