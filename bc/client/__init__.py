"""The Admin API's client, shared by the CLI and the TUI: the connection, its reconnect policy, the calls.

It imports no CLI, TUI, server or agent code (an import contract says so), so either front end can use it.
"""
