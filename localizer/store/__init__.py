"""The localizer's store: one sqlite file (WAL), its tables and its single writer thread."""
