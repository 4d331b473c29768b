"""Retention (docs/design.md §6): policies (`policy`, pure arithmetic), human units (`units`), and
the leader-elected retention service (`service`) that deletes fragments and tells bookies to trim.
"""

from stream.metadata.model import RetentionPolicy
from stream.retention.policy import IdleAction, RetentionPlan, plan_retention

__all__ = ["IdleAction", "RetentionPlan", "RetentionPolicy", "plan_retention"]
