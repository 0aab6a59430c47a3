"""Keys, the CA, node and operator certificates, join tokens and CA discovery.

Every TLS key here is ECDSA P-256: grpcio's TLS refuses Ed25519 certificates
(ARCHITECTURE.md §7). Nothing in this package does network I/O except
`bc.pki.discovery`, which blocks by design and is run in a thread.
"""
