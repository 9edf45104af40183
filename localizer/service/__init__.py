"""The localizer service: HTTP API, sessions, the localize thread, the embedded localizer."""
