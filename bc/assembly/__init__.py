"""Assembly of the server's processes: which loops a process runs and how each is kept running.

* `supervisor` -- runs every loop of a process as a named task and restarts one that raises, with
  jittered back-off, reporting each loop's state (running, restarting since, last error).
"""
