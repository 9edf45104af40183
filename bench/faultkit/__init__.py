"""Fault-injection harness pieces for bench/faults.py: scenarios, emulated hosts, injectors, scoring."""
