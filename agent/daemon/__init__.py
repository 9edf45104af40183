"""The node agent process: worker channel, localizer link, helper processes for one window, metrics."""
