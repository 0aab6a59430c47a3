"""The host units the `host` converger knows, by unit name (see agent.converge.host_units.base for the shape)."""

from __future__ import annotations

from collections.abc import Mapping

from agent.converge.host_units.base import Unit
from agent.converge.host_units.container_toolkit import ContainerToolkit
from agent.converge.host_units.fabric_manager import FabricManager
from agent.converge.host_units.gpu_sharing import GpuSharing
from agent.converge.host_units.hugepages import HugePages
from agent.converge.host_units.kernel_modules import KernelModules
from agent.converge.host_units.kubernetes import Kubernetes
from agent.converge.host_units.mig import Mig
from agent.converge.host_units.nvidia_driver import NvidiaDriver
from agent.converge.host_units.sysctl import Sysctl

UNITS: Mapping[str, Unit] = {
    u.name: u
    for u in (
        Sysctl(),
        KernelModules(),
        HugePages(),
        NvidiaDriver(),
        FabricManager(),
        Mig(),
        GpuSharing(),
        ContainerToolkit(),
        Kubernetes(),
    )
}
"""Applied in this order on every pass (the order of the spec's units does not matter): the driver before what
needs it (Fabric Manager, MIG, MPS), the container runtimes' CDI before the node joins a cluster."""
