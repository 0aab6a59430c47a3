"""`bc node`'s old entry module, kept so existing imports work: the agent now lives in `agent.app`
(wiring, the converge loop, `run_agent`) and `agent.session` (the session runner and dialing)."""

from __future__ import annotations

from agent.app import Agent, AgentOptions, AgentParts, production_parts, run_agent
from agent.session.dialing import backoff_delay

__all__ = ["Agent", "AgentOptions", "AgentParts", "backoff_delay", "production_parts", "run_agent"]
