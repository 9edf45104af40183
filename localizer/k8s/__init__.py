"""Kubernetes integration of the localizer: API client (events, pod state) and its worker thread."""
