"""Trainer plugins for gem_core. Each subpackage imports its trainer lazily."""
