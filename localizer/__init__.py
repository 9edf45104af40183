"""The localizer: expected ranges, distances and the rule (pure numpy), sessions, store, HTTP service, reports."""

from perftracker.role import not_a_training_process

not_a_training_process()  # the hooks that importing perftracker armed come off again
