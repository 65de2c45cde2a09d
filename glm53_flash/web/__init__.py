"""The teaching layer's server: the course deck, its notes and text edits, and the live playground."""
