"""The training process's side: hooks, detector, controller channel, profile window, hang and exit capture.

Everything here runs inside the user's training process and must never raise into it. Imports only
the standard library, torch, numpy and nvtx, and perftracker's own core (errors, clock, model, wire)."""
