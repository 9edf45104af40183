"""The node agent: worker channel, hardware samplers, summarizer (critical path, patterns), Kineto reader.

Imports only perftracker (model, wire, rawdata), numpy and the standard library at package level.
"""

from perftracker.role import not_a_training_process

not_a_training_process()  # the hooks that importing perftracker armed come off again
