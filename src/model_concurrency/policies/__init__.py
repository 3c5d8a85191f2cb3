"""Policies: pure decisions from an Observation to the next concurrency target."""

from model_concurrency.policies.aimd import AIMD
from model_concurrency.policies.base import Policy

__all__ = ["AIMD", "Policy"]
