"""Reports and charts built only from receipts (no number is typed into prose by hand)."""
