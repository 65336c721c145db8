"""Small shared helpers for the environments (word lists, ...)."""
