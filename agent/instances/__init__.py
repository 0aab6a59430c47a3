"""VMs on a node (docs/instances.md): the runtime seam, its fake and qemu implementations, and the pure
rules the `instances` converger (agent.converge.instances) applies: one instance's plan and host admission."""
