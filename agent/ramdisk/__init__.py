"""The `ramdisk` role: an agent booted in memory on a bare machine (docs/metal-ramdisk.md).

It is `bc node` with a `--role ramdisk` identity: the same session, dispatcher and journal, with
three differences wired in `agent.app` from here:

* `machine` reads the machine's disks, NICs and PCI GPUs from /sys and /proc under a root
  (`MachineTree`, `bc node --machine-root`), and `MachineHardware` adds them to the inventory;
* `journal_path` gives every boot a journal of its own, so a ramdisk reboot starts a new
  `journal_id` and the control plane fails what was in flight and not retry-safe `journal-lost`;
* the kinds `disk.wipe`, `deploy.image` and `boot.kexec` (agent/kinds/) act on the disks through
  `blockdev`, `image_stream`, `image_check` and the `kexec` seam.
"""
