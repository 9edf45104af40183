"""Diagnosis, the method: the patterns as arrays, expected ranges, the two distances, the rule, its floors and options."""
