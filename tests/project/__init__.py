"""Checks of the project as a whole: layout, import layers, project text, docs, the README walkthrough, the test tree itself."""
