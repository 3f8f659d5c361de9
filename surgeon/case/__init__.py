"""A case described once: case files and their validation (case), items as token rows and aligned
positions (encoding). Pure: no model is touched here."""
