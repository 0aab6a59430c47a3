"""Trust and identity: the bundle nodes trust, joining and renewal, operators, SSH, releases, serving certs."""
