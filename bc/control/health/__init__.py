"""The health reconciler's pure rules: GPU conditions, the policy an admin sets, the decision (docs/health.md)."""
