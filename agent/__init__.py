"""The node agent: worker channel, hardware samplers, summarizer (critical path, patterns), Kineto reader.

Imports only perftracker (model, wire, rawdata), numpy and the standard library at package level.
"""
