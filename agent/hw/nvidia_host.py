"""Names the NVIDIA driver gives a host: its kernel modules and Fabric Manager's service (used by the GPU node
host units, agent.converge.gpu_packages, and by the fake hardware's model of them, agent.hw.fake_gpu_host)."""

from __future__ import annotations

FABRIC_MANAGER_SERVICE = "nvidia-fabricmanager.service"
DRIVER_MODULES = ("nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia")
"""Unloaded in this order (users first), loaded again in the reverse."""
