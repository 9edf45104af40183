"""Diagnosis (pure numpy): expected ranges, distances, the rule, waits, findings and their sentences."""
