"""Diagnosis, the evidence: who waits for whom, contention, starvation, host and link causes, hardware health, imbalance, a step's lanes."""
