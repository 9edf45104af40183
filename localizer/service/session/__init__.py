"""Sessions at the localizer: the state machine from a trigger to a stored report, and its parts."""
