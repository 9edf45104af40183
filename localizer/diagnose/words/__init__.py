"""Diagnosis, the words: the sentences, headlines, evidence lines and next steps of findings and reports."""
