"""The site role (`bc node` joined with a `--role site` token): BMCs over Redfish, the boot server, the image cache.

docs/metal.md is the operator's page. The parts, each a module of one idea:

* `credentials`: the 0600 JSON file of BMC credentials the `site` section names, and that JSON's rules;
* `broker_credentials`: the same JSON as a secret of the broker (`credentials_secret_ref`), held in memory;
* `redfish`: the one seam to a BMC, over sushy, run off the loop with bounded timeouts;
* `bmc_hosts`: every BMC host the site drove, remembered on disk, so `site.httpProxy` never reaches one;
* `leases`: the boot leases `boot.prepareRamdisk` sets and `boot.cleanUp` removes, and the pure rule of a live one;
* `image_cache`: `cache_images` pulled and checked by digest, and re-checked before every serve;
* `boot_config`, `boot_http`, `dnsmasq`: the boot server (DHCP/PXE by dnsmasq, iPXE scripts and images over HTTP);
* `proxy_rules`: where `site.httpProxy` may go;
* `state`: what the converger learns from the section and the kinds read;
* `bmc_kinds`, `boot_kinds`, `proxy_kind`: the executors; `converger`: the `site` section.
"""
