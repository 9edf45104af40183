"""Which slowdown detections become automatic triggers, and which are held until they are worth a window."""
