"""The localizer: expected ranges, distances and the rule (pure numpy), sessions, store, HTTP service, reports."""
