"""Diagnosis, the verdict: findings from rule outcomes, their order, and what fixing each would save."""
