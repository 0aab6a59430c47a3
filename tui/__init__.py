"""`bc tui`: the live fleet view, a Textual app that is a client of the Admin API only.

Layout: `fmt` (pure formatting: ages, n/a), `fleet_model` (pure: rows, in-flight
commands, which node an event names), `columns` (pure: free-text column widths
from the terminal's), `feed` (the snapshot + Watch stream with reconnect on the
clients' one policy, `bc.client.reconnect`, dedupe by seq and per-node refetch), `source` (the Admin calls the
app makes, a seam tests fill with a fake), `app` (screens, banner, palette),
`screens/` (one module per screen). It never imports the store, the control
plane or the gateway (an import-linter contract holds it).
"""
