"""What every group of the control plane uses: the wake-up bus, the events log, the acting operator and the roles."""
