"""Diagnosis of incidents that are not slowdowns: hangs, crashes, and the first look from the hooks' phase times."""
