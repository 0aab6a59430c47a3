"""The agent's sessions: the runner that drives the I/O-free core over a Link, and dialing.

* `outbox`    -- what the agent has to say, handed to whichever session is open;
* `runner`    -- one session: the core over a link, with its dependencies passed in (`SessionDeps`);
* `dialing`   -- one session at a time over an injected `dial()`, full-jitter back-off, typed refusals;
* `grpc_dial` -- the production `dial()`: mutual TLS to the gateway from the identity files.
"""
