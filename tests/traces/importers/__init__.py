"""Tests of traces/importers/: every importer, its settings, completeness and session prefixes."""
