"""Instance networks: tap names, the nftables ruleset, taps on bridges and the guard (docs/instances.md)."""
